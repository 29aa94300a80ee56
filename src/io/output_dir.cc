#include "io/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <system_error>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "io/torch_checkpoint.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

// Longest suffix symprune adds to a name beside an output: ".NAME.tmp-XXXXXX" (12 bytes more).
constexpr size_t kTemporaryNameOverhead = 12;

// Absolute, with every existing symlink resolved (the missing tail is kept lexically).
fs::path resolved_path(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) abs = fs::absolute(p).lexically_normal();
  if (!abs.has_filename() && abs.has_parent_path()) abs = abs.parent_path();  // "a/b/" -> "a/b"
  return abs;
}

// Whether `inner` equals `outer` or lies below it (both resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

void check_name_length(const fs::path& resolved, std::string_view option, const fs::path& as_given) {
  const size_t length = resolved.filename().string().size();
  SYMPRUNE_CHECK(length + kTemporaryNameOverhead <= NAME_MAX,
                 "{} {}: the name is {} bytes long; symprune needs {} bytes more for the temporary names "
                 "beside it and the file system allows {} (choose a name of at most {} bytes)",
                 option, as_given.string(), length, kTemporaryNameOverhead, NAME_MAX,
                 NAME_MAX - kTemporaryNameOverhead);
}

// A symlink whose target does not exist would be replaced (or followed into nowhere): say so up front.
void check_not_dangling(const fs::path& p, std::string_view option) {
  std::error_code ec;
  const auto link = fs::symlink_status(p, ec);
  if (!fs::is_symlink(link)) return;
  const fs::path target = fs::read_symlink(p, ec);
  SYMPRUNE_CHECK(fs::exists(p, ec),
                 "{} {} is a symbolic link to {}, which does not exist; create the target "
                 "or choose another path",
                 option, p.string(), target.string());
}

void check_parent(const fs::path& resolved, std::string_view option, const fs::path& as_given) {
  std::error_code ec;
  const fs::path parent = resolved.parent_path();
  // A missing parent is refused rather than created: directories made here would be left behind by a
  // run that fails later.
  SYMPRUNE_CHECK(fs::is_directory(parent, ec), "{} {}: parent directory {} {}", option, as_given.string(),
                 parent.string(),
                 fs::exists(parent, ec) ? "is not a directory" : "does not exist (create it first)");
  // Checked before the run, not after an hour of pruning (root passes unless the file system is read-only).
  SYMPRUNE_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, "{} {}: cannot write in {}: {}", option,
                 as_given.string(), parent.string(), std::strerror(errno));
}

bool is_symprune_output(const fs::path& dir) {
  std::error_code ec;
  const fs::path marker = dir / kProvenanceFile;
  if (!fs::is_regular_file(marker, ec)) return false;
  std::ifstream in(marker);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.value("tool", "") == "symprune";
}

// ".NAME" + tag + 6 mkdtemp characters beside `target`.
bool is_temporary_sibling(const std::string& entry, const std::string& name, std::string_view tag) {
  const std::string prefix = hidden_name(name, tag);
  if (entry.size() != prefix.size() + 6 || !entry.starts_with(prefix)) return false;
  for (size_t i = prefix.size(); i < entry.size(); ++i)
    if (std::isalnum(static_cast<unsigned char>(entry[i])) == 0) return false;
  return true;
}

// `entry`, named like the temporary files or directories (`what`) that symprune removes beside the output
// `as_given`: refused when it is one of the run's inputs, which is never removed.
void check_temporary_not_input(const InputFootprint& inputs, const fs::path& entry, std::string_view option,
                               const fs::path& as_given, std::string_view what) {
  inputs.check_written(resolved_path(entry),
                       fmt::format("{} {}: {}, named like the temporary {} that symprune "
                                   "removes beside it,",
                                   option, as_given.string(), entry.string(), what));
}

// Removes a file or directory tree that an interrupted run left beside an output, saying so.
void remove_left_by_interrupted_run(const fs::path& p, std::string_view option) {
  std::error_code ec;
  remove_directory_tree(p, ec);
  if (ec)
    log::warn("{}: could not remove {} left by an interrupted run: {}", option, p.string(), ec.message());
  else
    log::warn("{}: removed {} left by an interrupted run", option, p.string());
}

// Under the lock no other run writes beside `target`, so what is there was left by an interrupted one,
// unless it is an input that happens to carry such a name: that is refused, never renamed or removed.
void recover_interrupted_runs(const fs::path& target, std::string_view option, const fs::path& as_given,
                              const InputFootprint& inputs) {
  std::error_code ec;
  const std::string name = target.filename().string();
  std::vector<fs::path> staged, replaced;
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    const std::string entry_name = entry.path().filename().string();
    const bool is_staged = is_temporary_sibling(entry_name, name, ".tmp-");
    const bool is_replaced = is_temporary_sibling(entry_name, name, ".old-");
    if (!is_staged && !is_replaced) continue;
    check_temporary_not_input(inputs, entry.path(), option, as_given, "directories");
    (is_staged ? staged : replaced).push_back(entry.path());
  }
  if (!fs::exists(fs::symlink_status(target, ec)) && !replaced.empty()) {
    // A replace was cut off between moving the old output aside and moving the new one in.
    fs::rename(replaced.front(), target, ec);
    if (!ec) {
      log::warn("{} {}: restored the previous output from {} (a replace was interrupted)", option,
                target.string(), replaced.front().string());
      replaced.erase(replaced.begin());
    }
  }
  for (const auto* list : {&staged, &replaced})
    for (const auto& p : *list) remove_left_by_interrupted_run(p, option);
}

std::string read_small_file(const fs::path& p) {
  std::ifstream in(p);
  std::string text;
  std::getline(in, text);
  return text;
}

// Who holds the lock file `lock` ("pid N"), when a running process holds it; nullopt when it is free (a
// killed run's lock file) or missing.
std::optional<std::string> lock_holder(const fs::path& lock) {
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  if (!held) return std::nullopt;
  const std::string holder = read_small_file(lock);
  return holder.empty() ? std::string("pid unknown") : holder;
}

}  // namespace

void OutputDirectory::check_no_running_run_inside() const {
  if (!existed_) return;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(path_, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".") || !name.ends_with(".lock")) continue;
    if (const auto holder = lock_holder(it->path()))
      fail(
          "{} {} holds {}, the lock of a running symprune run ({}): replacing it would remove that run's "
          "files; wait for it to finish or choose another {}",
          option_, as_given_.string(), it->path().string(), *holder, option_);
  }
}

// Linux 5.8; older headers (glibc 2.28) lack the name, and older kernels leave the bit unset.
#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000
#endif

bool is_mount_point(const fs::path& dir) {
  struct statx st {};
  if (::statx(AT_FDCWD, dir.c_str(), 0, STATX_BASIC_STATS, &st) == 0 &&
      (st.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0)
    return (st.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  // Kernels before 5.8: a mount of another file system (a bind mount of the same one goes unseen).
  struct stat self {};
  struct stat parent {};
  return ::stat(dir.c_str(), &self) == 0 && ::stat((dir / "..").c_str(), &parent) == 0 &&
         (self.st_dev != parent.st_dev || self.st_ino == parent.st_ino);
}

void InputFootprint::add_model_directory(const fs::path& dir) {
  std::error_code ec;
  const fs::path real = resolved_path(dir);
  directories_.push_back({real, "input model directory"});
  const auto add_model_file = [&](const fs::path& path) {
    std::error_code entry_ec;
    if (const auto s = stamp(path)) model_files_.push_back(*s);
    if (!fs::is_symlink(path, entry_ec)) return;
    const fs::path target = fs::canonical(path, entry_ec);
    if (entry_ec || is_within(target, real)) return;
    // A link out of the directory (a Hugging Face cache blob): its file and the directory holding it.
    files_.push_back({target, "input model file"});
    const fs::path holder = target.parent_path();
    const bool known = std::any_of(directories_.begin(), directories_.end(),
                                   [&](const Protected& d) { return d.path == holder; });
    if (!known) directories_.push_back({holder, "directory holding the input model's files"});
  };
  for (const auto& entry : fs::directory_iterator(real, ec)) add_model_file(entry.path());
  // Shards the index places in subdirectories are read as well (the files directly in it are above).
  for (const auto& shard : indexed_shard_files(real))
    if (shard.has_parent_path()) add_model_file(real / shard);
  if (has_torch_checkpoint(real))
    for (const auto& file : torch_weight_files(real))
      if (file.has_parent_path()) add_model_file(real / file);
}

std::optional<InputFootprint::FileStamp> InputFootprint::stamp(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;  // follows links
  return FileStamp{file, static_cast<uintmax_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                   static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

void InputFootprint::check_model_unchanged() const {
  for (const auto& before : model_files_) {
    const auto now = stamp(before.path);
    SYMPRUNE_CHECK(
        now && *now == before,
        "{} was {} while this run was reading the model: the pruned copy could mix the old and the "
        "new contents, so it is not written; run again on the model as it is now",
        before.path.string(),
        !now                                                         ? "removed"
        : now->inode != before.inode || now->device != before.device ? "replaced"
                                                                     : "modified");
  }
}

void InputFootprint::add_file(const fs::path& file) {
  std::error_code ec;
  if (file.empty() || !fs::exists(file, ec)) return;
  // A directory where one file or another is read from it (a tokenizer directory): nothing is written into
  // it.
  if (fs::is_directory(file, ec)) {
    directories_.push_back({resolved_path(file), "input directory"});
  } else {
    files_.push_back({resolved_path(file), "input file"});
  }
}

void InputFootprint::check_output(const fs::path& resolved, std::string_view option,
                                  const fs::path& as_given) const {
  check_written(resolved, fmt::format("{} {}", option, as_given.string()));
}

void InputFootprint::check_written(const fs::path& resolved, std::string_view subject) const {
  for (const auto& dir : directories_) {
    SYMPRUNE_CHECK(!is_within(resolved, dir.path), "{} is {} the {} {}; choose a directory outside it",
                   subject, resolved == dir.path ? "the same as" : "inside", dir.what, dir.path.string());
    SYMPRUNE_CHECK(!is_within(dir.path, resolved), "{} contains the {} {}; choose another directory", subject,
                   dir.what, dir.path.string());
  }
  for (const auto& file : files_) {
    SYMPRUNE_CHECK(resolved != file.path, "{} is the {} {}; choose another path", subject, file.what,
                   file.path.string());
    SYMPRUNE_CHECK(!is_within(file.path, resolved), "{} contains the {} {}; choose another directory",
                   subject, file.what, file.path.string());
  }
}

fs::path lock_file_of(const fs::path& target) {
  const fs::path named = target.has_filename() ? target : target.parent_path();  // "out/" is "out"
  return named.parent_path() / hidden_name(named.filename().string(), ".lock");
}

PathLock::PathLock(const fs::path& target, std::string_view option) {
  lock_path_ = lock_file_of(target);
  // Lock, then make sure the file locked is still the one at the path: a releasing holder unlinks it,
  // and a lock on an unlinked file would not exclude anyone.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // O_NOFOLLOW: a link there (to nowhere, or to an input) is not followed to create or truncate its target.
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    SYMPRUNE_CHECK(fd >= 0, "{} {}: cannot create the lock file {}: {}", option, target.string(),
                   lock_path_.string(), std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      const std::string holder = read_small_file(lock_path_);
      SYMPRUNE_CHECK(err != EWOULDBLOCK,
                     "{} {} is being written by another symprune run ({}); wait for it to finish or choose "
                     "another path",
                     option, target.string(), holder.empty() ? std::string("pid unknown") : holder);
      fail("{} {}: cannot lock {}: {}", option, target.string(), lock_path_.string(), std::strerror(err));
    }
    struct stat held {
    }, current{};
    if (::fstat(fd, &held) == 0 && ::stat(lock_path_.c_str(), &current) == 0 &&
        held.st_ino == current.st_ino && held.st_dev == current.st_dev) {
      const std::string owner = "pid " + std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) == 0) {
        [[maybe_unused]] const ssize_t written = ::pwrite(fd, owner.data(), owner.size(), 0);
      }
      fd_ = fd;
      cleanup_ = std::make_unique<interrupt::CleanupOnStop>(lock_path_);
      return;
    }
    ::close(fd);
  }
  fail("{} {}: could not take the lock {} (it keeps being replaced)", option, target.string(),
       lock_path_.string());
}

PathLock::~PathLock() {
  if (fd_ < 0) return;
  cleanup_.reset();
  ::unlink(lock_path_.c_str());  // while still holding the lock (see the constructor)
  ::close(fd_);
}

void release_stale_output_lock(const fs::path& out, std::string_view option) {
  const PathLock lock(resolved_path(out), option);
}

void check_output_parent_writable(const fs::path& out, std::string_view option) {
  check_parent(resolved_path(out), option, out);
}

OutputDirectory::OutputDirectory(const fs::path& out, const InputFootprint& inputs, bool force,
                                 std::string option)
    : option_(option), as_given_(out), force_(force), inputs_(inputs) {
  SYMPRUNE_CHECK(!out.empty(), "{}: no output directory given", option);
  check_not_dangling(out, option);
  path_ = resolved_path(out);
  SYMPRUNE_CHECK(path_.has_filename() && path_ != path_.root_path(),
                 "{} {}: not usable as an output directory", option, out.string());
  check_name_length(path_, option, out);
  check_output_directory_not_input(out, inputs, option);
  check_parent(path_, option, out);
  lock_ = std::make_unique<PathLock>(path_, option);
  recover_interrupted_runs(path_, option, out, inputs);
  std::error_code ec;
  if (!fs::exists(path_, ec)) return;
  existed_ = true;
  had_content_ = fs::is_directory(path_, ec) && !fs::is_empty(path_, ec);
  check_replaceable(false);
  const fs::path cwd = fs::current_path(ec);
  SYMPRUNE_CHECK(
      ec || !is_within(resolved_path(cwd), path_),
      "{} {} is (or holds) the current directory: the pruned model replaces it by a rename, which "
      "would leave this shell in a removed directory; run from another directory or choose another {}",
      option, out.string(), option);
}

void OutputDirectory::check_replaceable(bool again) const {
  // Someone may have put their own data in its place while the run worked: say so, and keep it.
  const std::string changed = again ? " (it changed while this run was working)" : "";
  const std::string out = as_given_.string();
  std::error_code ec;
  if (again && !fs::exists(fs::symlink_status(path_, ec))) return;  // gone: nothing to replace
  SYMPRUNE_CHECK(fs::is_directory(path_, ec), "{} {} exists and is not a directory{}", option_, out, changed);
  // The finished model takes the directory's place by a rename, which cannot move a mount point, and which
  // would leave a shell standing in the directory (a run with --out .) in a removed one, seeing nothing.
  SYMPRUNE_CHECK(
      !is_mount_point(path_),
      "{} {} is a mount point: the pruned model is moved into place by a rename, which cannot replace "
      "a mount point; give a directory inside it{}",
      option_, out, changed);
  if (fs::is_empty(path_, ec)) return;
  SYMPRUNE_CHECK(force_, "{} {} exists and is not empty (use --force to replace it){}", option_, out,
                 changed);
  SYMPRUNE_CHECK(is_symprune_output(path_),
                 "{} {} exists and was not written by symprune (it has no {} that symprune wrote): --force "
                 "replaces only symprune outputs; remove it yourself or choose another {}{}",
                 option_, out, kProvenanceFile, option_, changed);
  check_no_running_run_inside();
}

std::unique_ptr<StagedDirectory> OutputDirectory::stage() const {
  return std::make_unique<StagedDirectory>(path_, existed_);
}

void check_not_input(const fs::path& file, const InputFootprint& inputs, std::string_view option,
                     const std::vector<CompanionFile>& companions) {
  inputs.check_output(resolved_path(file), option, file);
  // Resolved one by one: a companion that is a link to an input would be written through.
  for (const auto& companion : companions)
    inputs.check_written(resolved_path(companion.path), fmt::format("{} {}: its {} {}", option, file.string(),
                                                                    companion.role, companion.path.string()));
}

void check_output_directory_not_input(const fs::path& out, const InputFootprint& inputs,
                                      std::string_view option) {
  check_not_input(out, inputs, option, {{lock_file_of(resolved_path(out)), "lock file"}});
}

void check_output_file(const fs::path& file, const InputFootprint& inputs, std::string_view option,
                       const OutputDirectory* out_dir, const std::vector<CompanionFile>& companions) {
  SYMPRUNE_CHECK(!file.empty(), "{}: no file given", option);
  check_not_dangling(file, option);
  const fs::path resolved = resolved_path(file);
  check_name_length(resolved, option, file);
  std::error_code ec;
  SYMPRUNE_CHECK(!fs::is_directory(resolved, ec), "{} {} is a directory; give a file name", option,
                 file.string());
  check_not_input(file, inputs, option, companions);
  // E.g. another run's checkpoint: that run holds the lock beside it.
  if (const auto holder = lock_holder(lock_file_of(resolved)))
    fail("{} {} is being written by another symprune run ({}); wait for it to finish or choose another path",
         option, file.string(), *holder);
  if (out_dir != nullptr)
    SYMPRUNE_CHECK(!is_within(resolved, out_dir->path()),
                   "{} {} is inside the output directory {}, which the run replaces; write it elsewhere",
                   option, file.string(), out_dir->as_given().string());
  // Decided on what the link leads to (fs::status follows it), not on its canonical path, which does not
  // exist for /proc links such as /dev/stdout to a pipe ("pipe:[N]").
  const fs::path target = output_file_target(file);
  const fs::file_status followed = fs::status(file, ec);
  if (fs::is_symlink(fs::symlink_status(file, ec)) && fs::exists(followed) &&
      !fs::is_regular_file(followed)) {
    fail(
        "{} {} is a symbolic link to {}, which is not a regular file ({}); symprune replaces the file it "
        "writes, so give the path of a regular file or of a new one",
        option, file.string(), (target != file ? target : fs::read_symlink(file, ec)).string(),
        fs::is_directory(followed) ? "a directory" : "a device, FIFO or socket");
  }
  check_output_file_directory(target);
}

std::unique_ptr<PathLock> lock_output_file(const fs::path& file, std::string_view option,
                                           const InputFootprint& inputs) {
  // Where write_file_atomically writes: beside the file, which is a symbolic link's target (replaced through
  // the link), so the lock and the temporaries are there.
  const fs::path written = output_file_target(file);
  const fs::path parent = written.has_parent_path() ? written.parent_path() : fs::path(".");
  const fs::path resolved = resolved_path(parent) / written.filename();
  auto lock = std::make_unique<PathLock>(resolved, option);
  std::error_code ec;
  const std::string name = resolved.filename().string();
  std::vector<fs::path> left;
  for (const auto& entry : fs::directory_iterator(resolved.parent_path(), ec))
    if (is_temporary_sibling(entry.path().filename().string(), name, ".tmp.") &&
        fs::is_regular_file(fs::symlink_status(entry.path(), ec))) {
      check_temporary_not_input(inputs, entry.path(), option, file, "files");
      left.push_back(entry.path());
    }
  for (const auto& p : left) remove_left_by_interrupted_run(p, option);
  return lock;
}

namespace {
std::vector<std::string>& recorded_command_line() {
  static std::vector<std::string> words;
  return words;
}
}  // namespace

void record_command_line(int argc, const char* const* argv) {
  recorded_command_line().assign(argv, argv + argc);
}

void write_provenance(const fs::path& dir, const nlohmann::json& provenance) {
  nlohmann::json written = provenance;
  // The paths of the configuration are as given: relative ones need the directory they were given in.
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  written["working_directory"] = ec ? nlohmann::json(nullptr) : nlohmann::json(cwd.string());
  if (!recorded_command_line().empty()) written["command_line"] = recorded_command_line();
  write_file_atomically(dir / kProvenanceFile, with_utf8_strings(written).dump(2) + "\n");
}

nlohmann::json build_provenance() {
  return {{"tool", "symprune"},
          {"version", build_info::kVersion},
          {"commit", build_info::kGitCommit},
          {"build", build_info::kBuildType}};
}

}  // namespace symprune::io
