#include "model/fingerprint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/hashing.h"
#include "io/torch_checkpoint.h"

namespace symprune::model {
namespace {

// Names why `path` cannot be read (ifstream keeps no reason: asked again of open(2)).
void check_opened(const std::ifstream& in, const std::filesystem::path& path) {
  if (in.good()) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  fail("{}: cannot open for fingerprinting: {}", path.string(),
       fd >= 0 ? std::string("read error") : std::string(std::strerror(err)));
}

std::string read_prefix(const std::filesystem::path& path, uint64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  check_opened(in, path);
  std::string data(static_cast<size_t>(max_bytes), '\0');
  in.read(data.data(), static_cast<std::streamsize>(max_bytes));
  data.resize(static_cast<size_t>(in.gcount()));
  return data;
}

// The tensor data from `begin` to `end`: all of it up to kWholeBytes (a fraction of a second), else 4 KiB
// at every 16 MiB and the last 4 KiB, so weights of another value (a fine-tune of
// the same shapes) change the fingerprint while a 7B model costs about 800 reads of 4 KiB.
void hash_data_samples(const std::filesystem::path& path, uint64_t begin, uint64_t end, Fnv1a64& hash) {
  constexpr uint64_t kWholeBytes = uint64_t{256} << 20;
  if (end <= begin) return;
  const bool whole = end - begin <= kWholeBytes;  // read in 1 MiB pieces, one after the other
  const uint64_t sample_bytes = whole ? uint64_t{1} << 20 : 4096;
  const uint64_t stride = whole ? sample_bytes : uint64_t{16} << 20;
  std::ifstream in(path, std::ios::binary);
  check_opened(in, path);
  std::vector<char> sample(sample_bytes);
  const auto hash_at = [&](uint64_t offset) {
    const uint64_t bytes = std::min(sample_bytes, end - offset);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(sample.data(), static_cast<std::streamsize>(bytes));
    SYMPRUNE_CHECK(in.gcount() == static_cast<std::streamsize>(bytes),
                   "{}: read failed at byte {} while fingerprinting", path.string(), offset);
    hash.update(sample.data(), bytes);
  };
  for (uint64_t offset = begin; offset < end; offset += stride) hash_at(offset);
  if (!whole) hash_at(end - sample_bytes);
}

}  // namespace

std::string model_fingerprint(const std::filesystem::path& dir) {
  const auto config = dir / "config.json";
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(config), "{}: missing config.json", dir.string());
  Fnv1a64 hash;
  const uint64_t config_size = std::filesystem::file_size(config);
  hash.update(read_prefix(config, config_size));
  // A PyTorch checkpoint's files (read only when the directory has no safetensors weights): the files
  // TorchModel reads, each by its name in the directory, size and contents sampled as a safetensors file's
  // data, from the start (the zip's pickle comes first).
  if (io::has_torch_checkpoint(dir)) {
    std::vector<std::filesystem::path> files = io::torch_weight_files(dir);
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      std::error_code ec;
      const uint64_t size = std::filesystem::file_size(dir / file, ec);
      hash.update(file.generic_string());
      hash.update_little_endian(ec ? ~uint64_t{0} : size, 8);  // a missing shard is TorchModel's error
      if (!ec) hash_data_samples(dir / file, 0, size, hash);
    }
    return fmt::format("{:016x}", hash.digest());
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const uint64_t size = std::filesystem::file_size(file);
    hash.update(file.filename().string());
    hash.update_little_endian(size, 8);
    std::string head = read_prefix(file, 8);
    uint64_t header_len = 0;
    for (size_t i = 0; i < head.size(); ++i)
      header_len |= static_cast<uint64_t>(static_cast<unsigned char>(head[i])) << (8 * i);
    // Garbage lengths are the safetensors reader's business; hash what the file holds.
    header_len = std::min<uint64_t>(header_len, size > 8 ? size - 8 : 0);
    hash.update(read_prefix(file, 8 + header_len));
    hash_data_samples(file, 8 + header_len, size, hash);
  }
  return fmt::format("{:016x}", hash.digest());
}

std::string model_fingerprint(const io::ResolvedModel& resolved) {
  return resolved.is_synthetic() ? resolved.synthetic->canonical() : model_fingerprint(resolved.dir);
}

}  // namespace symprune::model
