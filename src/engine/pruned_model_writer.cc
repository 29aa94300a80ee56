#include "engine/pruned_model_writer.h"

#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

fs::path normalized(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) abs = fs::absolute(p).lexically_normal();
  // Drop a trailing separator so "a/b/" and "a/b" compare equal.
  if (!abs.has_filename() && abs.has_parent_path()) abs = abs.parent_path();
  return abs;
}

// Whether `inner` equals `outer` or lies below it (both normalized).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// Weight files of other formats: copying them would ship unpruned weights beside the pruned ones.
bool is_other_weight_file(const std::string& name) {
  auto ends_with = [&](const char* suffix) { return name.ends_with(suffix); };
  return (name.starts_with("pytorch_model") && ends_with(".bin")) ||
         (name.starts_with("pytorch_model") && ends_with(".bin.index.json")) || ends_with(".pt") ||
         ends_with(".pth") || ends_with(".ckpt") || ends_with(".h5") || ends_with(".msgpack");
}

// fs::copy_file reports a failed sendfile as EIO, hiding "No space left on device" / "File too large":
// copy by read/write so the error says why.
void copy_file_checked(const fs::path& from, const fs::path& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  SYMPRUNE_CHECK(in >= 0, "{}: cannot open: {}", from.string(), std::strerror(errno));
  try {
    io::write_file_atomically(to, [&](int out, const fs::path& target) {
      std::vector<char> buffer(size_t{1} << 20);
      while (true) {
        const ssize_t n = ::read(in, buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        SYMPRUNE_CHECK(n >= 0, "{}: read failed: {}", from.string(), std::strerror(errno));
        if (n == 0) break;
        io::write_all(out, buffer.data(), static_cast<size_t>(n), target);
      }
    });
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

}  // namespace

void check_output_dir(const fs::path& input_dir, const fs::path& out, bool force) {
  SYMPRUNE_CHECK(!out.empty(), "--out: no output directory given");
  const fs::path in = normalized(input_dir), o = normalized(out);
  SYMPRUNE_CHECK(!is_within(o, in),
                 "--out {} is {} the input model directory {}; choose a directory outside it", out.string(),
                 o == in ? "the same as" : "inside", input_dir.string());
  SYMPRUNE_CHECK(!is_within(in, o),
                 "--out {} contains the input model directory {}; choose another directory", out.string(),
                 input_dir.string());
  std::error_code ec;
  // A missing parent is refused rather than created: directories made here would be left behind by a
  // run that fails later (convert-llama2c refuses it the same way).
  const fs::path parent = o.parent_path();
  SYMPRUNE_CHECK(fs::is_directory(parent, ec), "--out {}: parent directory {} {}", out.string(),
                 parent.string(),
                 fs::exists(parent, ec) ? "is not a directory" : "does not exist (create it first)");
  // Checked before the run, not after an hour of pruning (root passes unless the file system is read-only).
  SYMPRUNE_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, "--out {}: cannot write in {}: {}", out.string(),
                 parent.string(), std::strerror(errno));
  if (fs::exists(o, ec)) {
    SYMPRUNE_CHECK(fs::is_directory(o, ec), "--out {} exists and is not a directory", out.string());
    SYMPRUNE_CHECK(force || fs::is_empty(o, ec),
                   "--out {} exists and is not empty (use --force to replace it)", out.string());
  }
}

std::vector<std::string> write_pruned_model(const fs::path& input_dir, const fs::path& out,
                                            const std::map<std::string, PackedMask>& masks, bool force) {
  check_output_dir(input_dir, out, force);
  const io::SafetensorsModel model = io::SafetensorsModel::open_dir(input_dir);
  for (const auto& [name, mask] : masks) {
    SYMPRUNE_CHECK(model.contains(name), "mask for tensor '{}' which is not in {}", name, input_dir.string());
    const io::TensorInfo& info = model.info(name);
    SYMPRUNE_CHECK(info.shape.size() == 2 && info.shape[0] == mask.rows && info.shape[1] == mask.cols &&
                       mask.bits.size() == static_cast<size_t>((mask.rows * mask.cols + 7) / 8),
                   "mask [{}, {}] does not fit tensor '{}' of shape {} in {}", mask.rows, mask.cols, name,
                   shape_to_string(info.shape), model.file_of(name).path().string());
  }

  const fs::path o = normalized(out);
  io::StagedDirectory staged(o);
  const fs::path& tmp = staged.path();
  std::vector<std::string> written;
  try {
    // Weights, shard by shard, in the input's order.
    std::map<std::string, std::vector<std::string>> shards;  // shard file -> tensor names
    for (const auto& [name, shard] : model.weight_map()) shards[shard].push_back(name);
    for (auto& [shard, names] : shards) {
      const io::SafetensorsFile& file = model.file_of(names.front());
      std::vector<std::string> ordered;
      for (const auto& t : file.tensors()) ordered.push_back(t.name);
      std::vector<std::vector<std::byte>> copies;  // pruned tensors' modified bytes
      copies.reserve(masks.size());
      std::vector<io::TensorToWrite> tensors;
      for (const auto& name : ordered) {
        const io::TensorInfo& info = *file.find(name);
        std::span<const std::byte> bytes = file.bytes(info);
        auto it = masks.find(name);
        if (it != masks.end()) {
          copies.emplace_back(bytes.begin(), bytes.end());
          std::vector<std::byte>& data = copies.back();
          const size_t width = static_cast<size_t>(dtype_size(info.dtype));
          const PackedMask& mask = it->second;
          const int64_t count = mask.rows * mask.cols;
          for (int64_t i = 0; i < count; ++i)
            if (mask.pruned(i)) std::memset(data.data() + static_cast<size_t>(i) * width, 0, width);
          bytes = data;
        }
        tensors.push_back({name, info.dtype, info.shape, bytes});
      }
      std::map<std::string, std::string> metadata = file.metadata();
      metadata.emplace("format", "pt");
      const fs::path target = tmp / shard;
      fs::create_directories(target.parent_path());
      io::write_safetensors(target, tensors, metadata);
      written.push_back(shard);
    }

    // Every other top-level file, byte-identical (the index too: same shards, same weight_map).
    for (const auto& entry : fs::directory_iterator(input_dir)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory()) {
        log::warn("{}: subdirectory not copied to the pruned model", entry.path().string());
        continue;
      }
      if (name.ends_with(".safetensors")) continue;
      if (is_other_weight_file(name)) {
        log::warn("{}: other weight format, not copied to the pruned model", entry.path().string());
        continue;
      }
      if (!entry.is_regular_file()) continue;  // is_regular_file follows symlinks (HF cache snapshots)
      copy_file_checked(entry.path(), tmp / name);
      written.push_back(name);
    }
  } catch (const Error& e) {
    throw Error(staged.as_target(e.what()));  // the staged directory is removed on the way out
  }

  staged.install();
  std::sort(written.begin(), written.end());
  return written;
}

}  // namespace symprune::engine
