#pragma once
// Atomic file output: write into a temporary file in the destination directory, fsync, rename.
// Readers never see a partial file, and a failure leaves nothing behind.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/interrupt.h"

namespace symprune::io {

// Writes all `size` bytes to `fd`, retrying short writes and EINTR; errors name `path`.
void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

// Throws symprune::Error "<path>: directory <dir> does not exist" unless the directory that is to hold
// the file `path` exists, an Error when that directory cannot be written, and an Error when `path` exists as
// something other than a regular file or a symbolic link (a device, FIFO or socket, which the rename into
// place would replace). write_file_atomically checks it; callers may check it early, before long work.
void check_output_file_directory(const std::filesystem::path& path);

// "." + name + suffix: the names symprune gives its files beside an output (".out.tmp-XXXXXX", ".out.lock").
std::string hidden_name(std::string_view name, std::string_view suffix);

// fsync of a directory, so that renames and new entries in it survive a crash (best effort).
void sync_directory(const std::filesystem::path& dir);

// The file that an output named `path` is: the target of a symbolic link to an existing file (so a link's
// target is replaced, not the link, as for --out and --checkpoint), else `path` itself.
std::filesystem::path output_file_target(const std::filesystem::path& path);

// Calls `body(fd, path)` on a fresh temp file beside output_file_target(path), then makes it that file (mode
// 0666 less the umask). Messages name `path`.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(int fd, const std::filesystem::path& path)>& body);
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

// The process's file mode creation mask (umask), read without changing it: the mode bits that outputs
// created with explicit modes (mkstemp's 0600, mkdtemp's 0700, then widened) must leave out.
unsigned process_umask();

// fs::remove_all of a directory whose own mode may lack owner write (a replaced output's mode, given to the
// directory that replaced it): that is added first.
void remove_directory_tree(const std::filesystem::path& dir, std::error_code& ec);

// A directory built beside its final place (".NAME.tmp-XXXXXX", mode 0777 less the umask, or the mode and
// group of the directory it replaces) and moved there by one atomic rename, so a model directory appears
// whole or not at all. Removed on destruction unless installed, and by the interrupt watcher if the process
// is stopped at once (core/interrupt.h).

class StagedDirectory {
 public:
  // replace_existing: whether a directory at `target` is to be replaced (it existed, checked, when the run
  // started); otherwise install() refuses one that appeared in the meantime.
  StagedDirectory(const std::filesystem::path& target, bool replace_existing);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Moves the staged directory onto the target atomically: renameat2(RENAME_NOREPLACE) when no target
  // is to be replaced (a directory that appeared meanwhile is an error, never replaced), RENAME_EXCHANGE
  // when one is (the old one is then removed). File systems without renameat2 get two renames, the old
  // directory kept as ".NAME.old-XXXXXX" until the new one is in place (io/output_dir.h restores it if a
  // run is killed in between). The target's parent directory is fsynced before returning.
  void install();
  // `message` with the staged directory's path replaced by the target's: errors name the file the user
  // asked for (out/model.safetensors), not a temporary that no longer exists when they are printed.
  std::string as_target(std::string message) const;

 private:
  std::filesystem::path target_;
  std::filesystem::path path_;
  bool replace_existing_;
  std::optional<unsigned> final_mode_;  // the replaced directory's permission bits, given at install
  interrupt::CleanupOnStop cleanup_;
  bool installed_ = false;
};

}  // namespace symprune::io
