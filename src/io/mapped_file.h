#pragma once
// A read-only mmap of a whole regular file, for the weight readers (safetensors, PyTorch checkpoints). The
// descriptor stays open so that a reader can notice a file that shrank under the mapping before touching
// pages past its new end (io::read_mapped turns the SIGBUS of a read that races it into an Error).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace symprune::io {

// open(2) for reading that does not wait: a FIFO with no writer opens at once (and reads as empty) instead of
// blocking in open, where no signal could stop the run. The descriptor is blocking again when returned, so
// that a pipe with a writer (process substitution) reads as it comes. Returns -1 with errno set on failure.
int open_for_reading(const std::filesystem::path& path);

class MappedFile {
 public:
  MappedFile() = default;
  // Throws, naming `path`, when it cannot be opened or is not a regular file (a FIFO is refused without
  // waiting for a writer). An empty file maps to no bytes.
  static MappedFile open(const std::filesystem::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {map_, size_}; }
  const std::byte* data() const { return map_; }
  size_t size() const { return size_; }
  // The file's size now (smaller than size() when it shrank since open).
  uint64_t current_size(const std::filesystem::path& path) const;

 private:
  void release();
  int fd_ = -1;
  const std::byte* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace symprune::io
