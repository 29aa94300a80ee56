#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace symprune::io {

namespace fs = std::filesystem;

void write_all(int fd, const void* data, size_t size, const fs::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", path.string(), std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void check_output_file_directory(const fs::path& path) {
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  SYMPRUNE_CHECK(fs::is_directory(parent), "{}: directory {} does not exist", path.string(), parent.string());
  // Checked before long work, not only when the file is written (EROFS holds for root too).
  SYMPRUNE_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, "{}: cannot write in directory {}: {}",
                 path.string(), parent.string(), std::strerror(errno));
  // The file is replaced by a rename, which would put a regular file in place of a device such as
  // /dev/null (as root) or of a FIFO.
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  SYMPRUNE_CHECK(
      !fs::exists(status) || fs::is_regular_file(status) || fs::is_symlink(status),
      "{} exists and is not a regular file ({}); symprune replaces the file it writes, so give the "
      "path of a regular file or of a new one",
      path.string(), fs::is_directory(status) ? "a directory" : "a device, FIFO or socket");
}

std::string hidden_name(std::string_view name, std::string_view suffix) {
  std::string out = ".";  // built by append: GCC 12 warns falsely (-Wrestrict) on "." + string
  out += name;
  out += suffix;
  return out;
}

void sync_directory(const fs::path& dir) {
  // Makes renames and new entries in `dir` durable; best effort (some file systems refuse fsync on a
  // directory, and the data itself was fsynced already).
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

unsigned process_umask() {
  // Read where the kernel reports it (Linux 4.7+): umask() can only be read by setting it, which would race
  // with files other threads create.
  static const unsigned mask = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.starts_with("Umask:"))
        return static_cast<unsigned>(std::strtoul(line.c_str() + 6, nullptr, 8));
    const mode_t old = ::umask(022);
    ::umask(old);
    return static_cast<unsigned>(old);
  }();
  return mask;
}

fs::path output_file_target(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return path;
  const fs::path target = fs::canonical(path, ec);
  return ec ? path : target;  // a dangling link stays as given (checks name it)
}

void write_file_atomically(const fs::path& path, const std::function<void(int, const fs::path&)>& body) {
  const fs::path file = output_file_target(path);
  check_output_file_directory(file);
  const fs::path parent = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::string pattern = (parent / hidden_name(file.filename().string(), ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(pattern.data());
  SYMPRUNE_CHECK(fd >= 0, "{}: cannot create a temporary file in {}: {}", path.string(), parent.string(),
                 std::strerror(errno));
  interrupt::CleanupOnStop cleanup(pattern);
  try {
    body(fd, path);
    // mkstemp makes 0600: the mode open(2) would have given, as any other tool's output gets.
    SYMPRUNE_CHECK(::fchmod(fd, 0666 & ~process_umask()) == 0, "{}: chmod failed: {}", path.string(),
                   std::strerror(errno));
    SYMPRUNE_CHECK(::fsync(fd) == 0, "{}: fsync failed: {}", path.string(), std::strerror(errno));
    const int close_result = ::close(fd);
    SYMPRUNE_CHECK(close_result == 0, "{}: close failed: {}", path.string(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(pattern.c_str());
    throw;
  }
  if (::rename(pattern.c_str(), file.c_str()) != 0) {
    const int err = errno;
    ::unlink(pattern.c_str());
    fail("{}: cannot rename the temporary file into place: {}", path.string(), std::strerror(err));
  }
  sync_directory(parent);
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  write_file_atomically(
      path, [&](int fd, const fs::path& target) { write_all(fd, contents.data(), contents.size(), target); });
}

namespace {

fs::path make_dir_beside(const fs::path& target, const char* tag) {
  std::string pattern =
      (target.parent_path() / hidden_name(target.filename().string(), tag + std::string("XXXXXX"))).string();
  SYMPRUNE_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a temporary directory beside '{}': {}",
                 target.string(), std::strerror(errno));
  return pattern;
}

}  // namespace

StagedDirectory::StagedDirectory(const fs::path& target, bool replace_existing)
    : target_(target),
      path_(make_dir_beside(target, ".tmp-")),
      replace_existing_(replace_existing),
      cleanup_(path_) {
  // mkdtemp makes 0700. A directory it replaces (one prepared for the run, or an earlier output) lends its
  // mode and group, so that a shared or setgid directory stays so (the files written into it inherit the
  // group then); else the mode mkdir(2) would give.
  struct stat existing {};
  if (replace_existing && ::stat(target.c_str(), &existing) == 0 && S_ISDIR(existing.st_mode)) {
    if (::chown(path_.c_str(), static_cast<uid_t>(-1), existing.st_gid) != 0) {
      // Not a member of that group: the new directory keeps this process's group.
    }
    // Writable by its owner while it is filled (the mode may lack that); the exact mode at install.
    final_mode_ = existing.st_mode & 07777;
    ::chmod(path_.c_str(), *final_mode_ | S_IRWXU);
  } else {
    ::chmod(path_.c_str(), 0777 & ~process_umask());
  }
}

void remove_directory_tree(const fs::path& dir, std::error_code& ec) {
  // Only the top directory may carry a mode without owner write (one given from a replaced directory, e.g.
  // 0555); what is inside it was created with ordinary modes.
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IRWXU) != S_IRWXU)
    ::chmod(dir.c_str(), (st.st_mode & 07777) | S_IRWXU);
  fs::remove_all(dir, ec);
}

StagedDirectory::~StagedDirectory() {
  if (installed_) return;
  std::error_code ec;
  remove_directory_tree(path_, ec);
}

std::string StagedDirectory::as_target(std::string message) const {
  const std::string from = path_.string(), to = target_.string();
  for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
    message.replace(at, from.size(), to);
  return message;
}

void StagedDirectory::install() {
  std::error_code ec;
  const fs::path parent = target_.parent_path();
  const bool replacing = replace_existing_ && fs::exists(fs::symlink_status(target_, ec));
  // The replaced directory's mode, once the new one is in its place (given before, a mode without owner write
  // would keep a failed install's staging directory from being removed).
  const auto give_final_mode = [&] {
    if (final_mode_ && ::chmod(target_.c_str(), *final_mode_) != 0)
      log::warn("{}: could not give it the mode of the directory it replaced: {}", target_.string(),
                std::strerror(errno));
  };
  const unsigned flags = replacing ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  int err = 0;
  // Each way of moving the directory in runs with the clean-up list locked (release_after): a second signal
  // meanwhile stops the process only once the new directory is in place, and never removes it.
  cleanup_.release_after([&] {
    installed_ = ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), flags) == 0;
    err = errno;
    return installed_;
  });
  if (installed_) {
    give_final_mode();
    sync_directory(parent);
    if (replacing) {
      // path_ now holds the replaced directory; until it is gone a kill leaves it as a stale staging
      // directory, which the next run for this output removes.
      remove_directory_tree(path_, ec);
      if (ec) log::warn("could not remove the replaced directory '{}': {}", path_.string(), ec.message());
    }
    return;
  }
  SYMPRUNE_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP,
                 "cannot move the new directory into '{}': {}", target_.string(),
                 err == EEXIST ? "it appeared while this run was writing (another process created it)"
                               : std::strerror(err));
  // No renameat2 on this file system: two renames, the old directory kept until the new one is in place.
  if (!replacing) {
    cleanup_.release_after([&] {
      fs::rename(path_, target_, ec);
      SYMPRUNE_CHECK(!ec, "cannot move the new directory into '{}': {}", target_.string(), ec.message());
      return installed_ = true;
    });
    give_final_mode();
    sync_directory(parent);
    return;
  }
  const fs::path old = make_dir_beside(target_, ".old-");
  cleanup_.release_after([&] {
    fs::rename(target_, old, ec);  // an empty directory (the mkdtemp placeholder) is replaced
    if (ec) {
      fs::remove(old, ec);
      fail("cannot move the existing '{}' aside: {}", target_.string(), ec.message());
    }
    fs::rename(path_, target_, ec);
    if (ec) {
      std::error_code restore;
      fs::rename(old, target_, restore);
      fail("cannot move the new directory into '{}': {}", target_.string(), ec.message());
    }
    return installed_ = true;
  });
  give_final_mode();
  sync_directory(parent);
  remove_directory_tree(old, ec);
  if (ec) log::warn("could not remove the replaced directory '{}': {}", old.string(), ec.message());
}

}  // namespace symprune::io
