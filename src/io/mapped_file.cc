#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace symprune::io {

int open_for_reading(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fd;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

MappedFile MappedFile::open(const std::filesystem::path& path) {
  MappedFile file;
  const int fd = open_for_reading(path);
  SYMPRUNE_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  file.fd_ = fd;  // owned from here: every throw below releases it
  struct stat st {};
  SYMPRUNE_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat: {}", path.string(), std::strerror(errno));
  SYMPRUNE_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path.string());
  if (st.st_size == 0) return file;  // mmap refuses a length of 0
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  SYMPRUNE_CHECK(map != MAP_FAILED, "{}: mmap failed: {}", path.string(), std::strerror(errno));
  file.map_ = static_cast<const std::byte*>(map);
  file.size_ = static_cast<size_t>(st.st_size);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  release();
}

void MappedFile::release() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

uint64_t MappedFile::current_size(const std::filesystem::path& path) const {
  struct stat st {};
  SYMPRUNE_CHECK(::fstat(fd_, &st) == 0, "{}: cannot stat: {}", path.string(), std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace symprune::io
