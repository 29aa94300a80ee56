#pragma once
// Atomic file output: write into a temporary file in the destination directory, fsync, rename.
// Readers never see a partial file, and a failure leaves nothing behind.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string_view>

namespace symprune::io {

// Writes all `size` bytes to `fd`, retrying short writes and EINTR; errors name `path`.
void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

// Calls `body(fd, path)` on a fresh temp file beside `path`, then makes it `path` (mode 0644).
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(int fd, const std::filesystem::path& path)>& body);
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace symprune::io
