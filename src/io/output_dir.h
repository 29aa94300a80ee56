#pragma once
// Where a run may write, checked before any work (nothing lost, nothing overwritten by mistake):
//
//  * InputFootprint: the real places a run reads. A model directory contributes itself and the real
//    location of every file in it (Hugging Face cache snapshots are symlinks into ../../blobs, so the
//    blobs directory is protected too); single files (calibration, evaluation text, recipe, tokenizer,
//    checkpoint) contribute their real path. No output may replace, contain or lie inside any of them.
//  * OutputDirectory (--out): refused when it is a dangling symlink, has a name too long for the
//    temporary names beside it, has a missing or unwritable parent, is a file, or is a non-empty
//    directory — unless --force is given and the directory carries symprune's provenance file, i.e. it
//    is a symprune output (--force never deletes anything else). While it exists it holds an exclusive
//    lock (".NAME.lock" beside the output, flock), so two runs can never write the same output; under the
//    lock it removes what interrupted runs left beside the output (".NAME.tmp-XXXXXX" staging directories,
//    ".NAME.old-XXXXXX" replaced ones) and restores an output whose replacement was cut off midway.
//  * check_output_file (--report and similar single files): parent exists, name fits, and the file is not
//    an input, not inside a protected directory and not inside the output directory.
//  * What a writer keeps beside its output (the lock, a checkpoint's staging, previous and completion files,
//    the temporary directories of an output) is checked like the output: an input under one of those names
//    would be overwritten, renamed or removed.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/atomic_file.h"

namespace symprune::io {

// Written into every output directory symprune creates (version, commit, command, resolved options,
// input fingerprints); its presence is what lets --force replace a directory.
inline constexpr const char* kProvenanceFile = "symprune_provenance.json";

// Whether `dir` is the root of a mount (a file system or a bind mount there).
bool is_mount_point(const std::filesystem::path& dir);

class InputFootprint {
 public:
  // A model directory: the directory and the real location of each file directly in it and of each shard
  // its index places in a subdirectory.
  void add_model_directory(const std::filesystem::path& dir);
  // One input file, or a directory an input is read from (a tokenizer directory), which is then protected as
  // a whole. Missing paths are ignored: they fail later with their own error.
  void add_file(const std::filesystem::path& file);

  // Throws symprune::Error naming `option` and `as_given` when `resolved` (an absolute, symlink-free
  // path) equals, contains or lies inside an input.
  void check_output(const std::filesystem::path& resolved, std::string_view option,
                    const std::filesystem::path& as_given) const;
  // The same, with `subject` naming in messages what would be written ("--checkpoint c: its staging file
  // c.tmp").
  void check_written(const std::filesystem::path& resolved, std::string_view subject) const;

  // Throws when a file of the model directory changed since add_model_directory (size, modification time
  // or the file itself): weights are read until the output is written, and a copy made over the input
  // during the run would mix masks of the old weights with the new ones.
  void check_model_unchanged() const;

 private:
  struct FileStamp {
    std::filesystem::path path;
    uintmax_t size = 0;
    int64_t modified_ns = 0;
    uint64_t inode = 0, device = 0;
    bool operator==(const FileStamp&) const = default;
  };
  static std::optional<FileStamp> stamp(const std::filesystem::path& file);
  std::vector<FileStamp> model_files_;

  struct Protected {
    std::filesystem::path path;
    std::string what;  // "input model directory", ...
  };
  std::vector<Protected> directories_;  // nothing may be written inside these
  std::vector<Protected> files_;        // nor replace these or a directory holding them
};

// An exclusive lock on a path, held through a file ".NAME.lock" beside it (flock). The lock file is
// removed on release; a lock file left by a killed process does not block (the kernel drops its lock).
class PathLock {
 public:
  // Throws symprune::Error naming `option` when another process holds the lock.
  PathLock(const std::filesystem::path& target, std::string_view option);
  ~PathLock();
  PathLock(const PathLock&) = delete;
  PathLock& operator=(const PathLock&) = delete;

 private:
  std::filesystem::path lock_path_;
  int fd_ = -1;
  std::unique_ptr<interrupt::CleanupOnStop> cleanup_;  // a process stopped at once removes it too
};

// Takes and releases the lock of an output that this run does not write (a finished run found again): fails
// like OutputDirectory when another run holds it, and removes a lock file left by a killed run.
void release_stale_output_lock(const std::filesystem::path& out, std::string_view option);

class OutputDirectory {
 public:
  // Checks `out` (see above), takes the lock and cleans up after interrupted runs. `option` names the
  // output in messages ("--out").
  OutputDirectory(const std::filesystem::path& out, const InputFootprint& inputs, bool force,
                  std::string option = "--out");
  const std::filesystem::path& path() const { return path_; }  // absolute, symlinks resolved
  const std::filesystem::path& as_given() const { return as_given_; }
  // Whether a directory existed at path() when the run started, and whether it held anything (an output
  // that --force replaces): what a run that fails after installing its model restores.
  bool existed() const { return existed_; }
  bool had_content() const { return had_content_; }
  // A staging directory beside the output; install it with StagedDirectory::install().
  std::unique_ptr<StagedDirectory> stage() const;
  // Throws when the directory to be replaced holds the lock of a running run (e.g. its checkpoint was
  // placed there): checked when the run starts and again just before installing.
  void check_no_running_run_inside() const;
  // Throws unless what is at path() may be replaced by the new output: nothing, or a directory that is
  // empty, or (with force) a symprune output holding no running run's lock. Checked when the run starts,
  // and again (again = true) just before installing: another process may have put its own data there in
  // the meantime, which is kept, never replaced.
  void check_replaceable(bool again) const;
  // InputFootprint::check_model_unchanged of the inputs given to the constructor (before installing).
  void check_inputs_unchanged() const { inputs_.check_model_unchanged(); }

 private:
  std::string option_;
  std::filesystem::path as_given_;
  std::filesystem::path path_;
  bool force_ = false;
  bool existed_ = false, had_content_ = false;
  InputFootprint inputs_;
  std::unique_ptr<PathLock> lock_;
};

// For the ranks other than rank 0 (which makes the OutputDirectory) that write shards into `out`'s staging
// directory: whether they can write in its parent, checked before any work like rank 0's (a file system one
// node mounts read-only would otherwise fail the run after its last block).
void check_output_parent_writable(const std::filesystem::path& out, std::string_view option);

// A file that a writer keeps beside its output: its path and its role in messages ("staging file").
struct CompanionFile {
  std::filesystem::path path;
  std::string role;
};

// Checks a single output file before any work; `out_dir` (optional) is the run's output directory;
// `companions`, the files its writer keeps beside it (the checkpoint's), must not be inputs either.
void check_output_file(const std::filesystem::path& file, const InputFootprint& inputs,
                       std::string_view option, const OutputDirectory* out_dir = nullptr,
                       const std::vector<CompanionFile>& companions = {});

// The lock of output file `file` (PathLock, beside the file, a symbolic link's target: the write replaces the
// target, not the link) for as long as the run may write it, taken after check_output_file. Under it no other
// run writes beside the file, so the temporaries there of
// write_file_atomically (".NAME.tmp.XXXXXX") were left by a killed run writing this file: they are removed,
// each with a warning (one that is an input is refused, never removed).
[[nodiscard]] std::unique_ptr<PathLock> lock_output_file(const std::filesystem::path& file,
                                                         std::string_view option,
                                                         const InputFootprint& inputs);

// The part of check_output_file about inputs alone: `file` and its companions are no input and hold none.
void check_not_input(const std::filesystem::path& file, const InputFootprint& inputs, std::string_view option,
                     const std::vector<CompanionFile>& companions = {});

// --out and the lock file its run holds beside it (where the link resolves) are no input: checked before the
// lock is taken, which writes into that file and removes it.
void check_output_directory_not_input(const std::filesystem::path& out, const InputFootprint& inputs,
                                      std::string_view option);

// The lock file that PathLock(target) holds beside `target`.
std::filesystem::path lock_file_of(const std::filesystem::path& target);

// The process's command line, as main() received it, for the provenance files (none recorded: no entry).
void record_command_line(int argc, const char* const* argv);

// Writes kProvenanceFile into `dir` (atomically), with the working directory and the recorded command line.
void write_provenance(const std::filesystem::path& dir, const nlohmann::json& provenance);

// version, commit and build of this binary, for reports and provenance files.
nlohmann::json build_provenance();

}  // namespace symprune::io
