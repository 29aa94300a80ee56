#include "engine/pruned_model_writer.h"

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
#include "core/fault.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

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

std::vector<std::string> write_pruned_model(const fs::path& input_dir, const io::OutputDirectory& out,
                                            const std::map<std::string, PackedMask>& masks,
                                            const nlohmann::json& provenance) {
  const io::SafetensorsModel model = io::SafetensorsModel::open_dir(input_dir);
  for (const auto& [name, mask] : masks) {
    SYMPRUNE_CHECK(model.contains(name), "mask for tensor '{}' which is not in {}", name, input_dir.string());
    const io::TensorInfo& info = model.info(name);
    SYMPRUNE_CHECK(info.shape.size() == 2 && info.shape[0] == mask.rows && info.shape[1] == mask.cols &&
                       mask.bits.size() == static_cast<size_t>((mask.rows * mask.cols + 7) / 8),
                   "mask [{}, {}] does not fit tensor '{}' of shape {} in {}", mask.rows, mask.cols, name,
                   shape_to_string(info.shape), model.file_of(name).path().string());
  }

  const std::unique_ptr<io::StagedDirectory> staging = out.stage();
  io::StagedDirectory& staged = *staging;
  const fs::path& tmp = staged.path();
  std::vector<std::string> written;
  try {
    // Weights, shard by shard, in the input's order.
    std::map<std::string, std::vector<std::string>> shards;  // shard file -> tensor names
    for (const auto& [name, shard] : model.weight_map()) shards[shard].push_back(name);
    for (auto& [shard, names] : shards) {
      interrupt::check();
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
      if (name.ends_with(".safetensors") || name == io::kProvenanceFile) continue;
      if (is_other_weight_file(name)) {
        log::warn("{}: other weight format, not copied to the pruned model", entry.path().string());
        continue;
      }
      if (!entry.is_regular_file()) continue;  // is_regular_file follows symlinks (HF cache snapshots)
      copy_file_checked(entry.path(), tmp / name);
      written.push_back(name);
    }
    io::write_provenance(tmp, provenance);
    written.push_back(io::kProvenanceFile);
    fault::at("before_install");
    interrupt::check();
  } catch (const interrupt::Interrupted&) {
    throw;  // the staged directory is removed on the way out
  } catch (const Error& e) {
    throw Error(staged.as_target(e.what()));  // the staged directory is removed on the way out
  }

  staged.install();
  std::sort(written.begin(), written.end());
  return written;
}

}  // namespace symprune::engine
