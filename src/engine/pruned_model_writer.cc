#include "engine/pruned_model_writer.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <system_error>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "core/system_memory.h"
#include "engine/collective_errors.h"
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

// Whether a stored float of `width` bytes (little-endian) is ±0: every bit but the sign is clear.
bool is_zero_float(const std::byte* value, size_t width) {
  for (size_t b = 0; b + 1 < width; ++b)
    if (value[b] != std::byte{0}) return false;
  return (value[width - 1] & std::byte{0x7f}) == std::byte{0};
}

// Logs how far this rank's shards are written: at info every log::kProgressLineSeconds with an ETA (writing
// a 70B model takes minutes), at debug each shard ("writing the pruned model: 12.3 GiB of 130.4 GiB (31.0 s,
// ETA 296.2 s)"). The log's is rank 0's share.
class WriteProgress {
 public:
  WriteProgress(const io::TensorSource& source, const std::vector<const io::TensorSource::Shard*>& mine)
      : start_(log::ProgressPacer::Clock::now()), pacer_(log::kProgressLineSeconds, start_) {
    for (const auto* shard : mine)
      for (const auto& name : shard->tensors) total_ += tensor_bytes(source.info(name));
  }
  void tensor_written(const io::TensorInfo& info) {
    done_ += tensor_bytes(info);
    if (done_ > 0 && done_ < total_ && pacer_.due(log::ProgressPacer::Clock::now()))
      log::info("writing the pruned model: {} of {} ({:.1f} s, ETA {:.1f} s)", format_bytes(done_),
                format_bytes(total_), seconds(), seconds() / done_ * (total_ - done_));
  }
  void shard_written(const std::string& file) const {
    log::debug("writing the pruned model: {} written, {} of {} ({:.1f} s)", file, format_bytes(done_),
               format_bytes(total_), seconds());
  }

 private:
  static double tensor_bytes(const io::TensorInfo& info) {
    return static_cast<double>(info.data_end - info.data_begin);
  }
  double seconds() const {
    return std::chrono::duration<double>(log::ProgressPacer::Clock::now() - start_).count();
  }
  log::ProgressPacer::Clock::time_point start_;
  log::ProgressPacer pacer_;
  double total_ = 0.0, done_ = 0.0;
};

// One shard of the copy: every tensor's stored bytes, with the pruned entries of masked tensors zeroed; one
// tensor in memory at a time. Adds the zero entries of each masked tensor as written to `zeros`.
void write_shard(const io::TensorSource& source, const io::TensorSource::Shard& shard,
                 const std::map<std::string, PackedMask>& masks, const fs::path& target,
                 std::map<std::string, int64_t>& zeros, WriteProgress& progress) {
  std::vector<io::TensorToWrite> tensors;
  for (const auto& name : shard.tensors) {
    const io::TensorInfo& info = source.info(name);
    tensors.push_back({name, info.dtype, info.shape, {}});
  }
  std::map<std::string, std::string> metadata = shard.metadata;
  metadata.emplace("format", "pt");
  fs::create_directories(target.parent_path());
  // Tensor i's bytes, with its pruned entries zeroed.
  auto fill = [&](size_t i, std::vector<std::byte>& bytes) {
    source.read_bytes(tensors[i].name, bytes);
    auto it = masks.find(tensors[i].name);
    if (it == masks.end()) return;
    const size_t width = static_cast<size_t>(dtype_size(tensors[i].dtype));
    const PackedMask& mask = it->second;
    const int64_t count = mask.rows * mask.cols;
    int64_t& zero = zeros[tensors[i].name];
    for (int64_t e = 0; e < count; ++e) {
      std::byte* value = bytes.data() + static_cast<size_t>(e) * width;
      if (mask.pruned(e)) {
        std::memset(value, 0, width);
        ++zero;
      } else if (is_zero_float(value, width)) {
        ++zero;
      }
    }
  };
  io::write_safetensors_streamed(target, tensors, metadata, [&](size_t i, std::vector<std::byte>& bytes) {
    interrupt::check();
    fill(i, bytes);
    progress.tensor_written(source.info(tensors[i].name));  // handed over to be written
  });
  progress.shard_written(shard.file);
}

// Every other top-level file of the input directory, byte-identical; symprune's own provenance file of an
// input that is a symprune output is replaced. A safetensors index is never copied: the output's is written
// from the shards as written (an input index may lack its "metadata", which transformers requires, or miss a
// tensor that its shard holds).
std::vector<std::string> copy_other_files(const fs::path& input_dir, const fs::path& tmp,
                                          const io::TensorSource& source,
                                          const std::vector<io::TensorSource::Shard>& shards) {
  std::set<std::string> weight_files;
  std::set<std::string> weight_subdirectories;  // shards may sit in subdirectories the index names
  for (const auto& file : source.input_weight_files())
    weight_files.insert(file);  // written in another format
  for (const auto& shard : shards) {
    weight_files.insert(shard.file);
    const fs::path relative(shard.file);
    if (relative.has_parent_path()) weight_subdirectories.insert(relative.begin()->string());
  }
  std::vector<std::string> written;
  for (const auto& entry : fs::directory_iterator(input_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory()) {
      if (weight_subdirectories.count(name) > 0) {
        log::warn("{}: only the model's weight files in this subdirectory are in the pruned model",
                  entry.path().string());
      } else {
        log::warn("{}: subdirectory not copied to the pruned model", entry.path().string());
      }
      continue;
    }
    if (name == io::kProvenanceFile || weight_files.count(name) > 0) continue;
    if (name == io::kSafetensorsIndexFile && source.indexed()) continue;  // written anew
    if (name == io::kSafetensorsIndexFile) {
      // model.safetensors was read (as transformers does when both exist): this index names other files.
      log::warn("{}: not read (the weights come from model.safetensors), not copied to the pruned model",
                entry.path().string());
      continue;
    }
    if (name == "adapter_config.json" || name.starts_with("adapter_model.")) {
      // A PEFT adapter beside the base weights: transformers applies it on load when the configuration is
      // there, and fails without its weights. The base is pruned without the adapter, so neither is copied.
      log::warn(
          "{}: part of a PEFT adapter, which was not merged into the weights pruned here: not copied to "
          "the pruned model (to prune the adapted model, merge the adapter first, e.g. with peft's "
          "merge_and_unload, and prune the merged model)",
          entry.path().string());
      continue;
    }
    if (name.ends_with(".safetensors")) {
      // Not the model's weights (e.g. consolidated.safetensors beside the shards): copied, it could be
      // taken for an unpruned model.
      log::warn("{}: not one of the model's weight files, not copied to the pruned model",
                entry.path().string());
      continue;
    }
    if (is_other_weight_file(name)) {
      log::warn("{}: other weight format, not copied to the pruned model", entry.path().string());
      continue;
    }
    if (!entry.is_regular_file()) {  // is_regular_file follows symlinks (HF cache snapshots)
      std::error_code ec;
      log::warn(
          "{}: {}, not copied to the pruned model", entry.path().string(),
          fs::is_symlink(entry.symlink_status(ec)) && !fs::exists(entry.path(), ec)
              ? fmt::format("a link to {}, which does not exist", fs::read_symlink(entry.path(), ec).string())
              : std::string("not a regular file (a pipe, socket or device)"));
      continue;
    }
    copy_file_checked(entry.path(), tmp / name);
    written.push_back(name);
  }
  return written;
}

// The index of a sharded output: every tensor of every shard as written, and their bytes.
std::string index_json(const io::TensorSource& source, const std::vector<io::TensorSource::Shard>& shards) {
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (const auto& shard : shards)
    for (const auto& name : shard.tensors) {
      weight_map[name] = shard.file;
      const io::TensorInfo& info = source.info(name);
      total += static_cast<uint64_t>(info.numel() * dtype_size(info.dtype));
    }
  return nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
}

}  // namespace

ModelMasks::ModelMasks(const io::TensorSource& source, int rank, int ranks)
    : rank_(rank), ranks_(ranks), source_(&source) {
  SYMPRUNE_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
  const std::vector<io::TensorSource::Shard> shards = source.shards();
  for (size_t i = 0; i < shards.size(); ++i)
    for (const auto& name : shards[i].tensors) keepers_.emplace(name, static_cast<int>(i % ranks));
}

int ModelMasks::keeper(const std::string& name) const {
  const auto it = keepers_.find(name);
  SYMPRUNE_ASSERT(it != keepers_.end(), "mask of tensor '{}', which no shard holds", name);
  return it->second;
}

bool ModelMasks::fits(const std::string& name, Shape shape) const {
  if (!is_tensor(name)) return false;
  const std::vector<int64_t>& tensor = source_->info(name).shape;
  return tensor.size() == 2 && tensor[0] == shape.rows && tensor[1] == shape.cols;
}

void ModelMasks::add(const std::string& name, PackedMask mask) {
  SYMPRUNE_ASSERT(mask.bits.size() == static_cast<size_t>(Shape{mask.rows, mask.cols}.bytes()),
                  "mask of '{}' has {} bytes for [{}, {}]", name, mask.bits.size(), mask.rows, mask.cols);
  add_shape(name, {mask.rows, mask.cols});
  if (!keeps(name)) return;
  // Bits once added are never replaced: a checkpoint's writer may be reading them.
  const bool added = kept_.emplace(name, std::move(mask)).second;
  SYMPRUNE_ASSERT(added, "mask of '{}' added twice", name);
}

void ModelMasks::add_shape(const std::string& name, Shape shape) {
  keeper(name);  // a tensor of the source
  shapes_.insert_or_assign(name, shape);
}

int64_t ModelMasks::kept_bytes(const std::vector<std::pair<std::string, Shape>>& names) const {
  int64_t bytes = 0;
  for (const auto& [name, shape] : names) bytes += keeps(name) ? shape.bytes() : 0;
  return bytes;
}

WrittenModel write_pruned_model(dist::Communicator& comm, const io::TensorSource& source,
                                const fs::path& input_dir, const io::OutputDirectory* out,
                                const ModelMasks& masks,
                                const std::map<std::string, std::string>& extra_files,
                                const nlohmann::json& provenance) {
  const bool root = comm.rank() == 0;
  SYMPRUNE_ASSERT(!root || out != nullptr, "rank 0 writes without an output directory");
  SYMPRUNE_ASSERT(masks.rank() == comm.rank() && masks.ranks() == comm.size(),
                  "masks kept for rank {} of {}, written by rank {} of {}", masks.rank(), masks.ranks(),
                  comm.rank(), comm.size());
  for (const auto& [name, shape] : masks.shapes())
    SYMPRUNE_ASSERT(!masks.keeps(name) || masks.kept().count(name) > 0, "rank {} keeps no bits of mask '{}'",
                    comm.rank(), name);
  for (const auto& [name, mask] : masks.kept()) {
    SYMPRUNE_CHECK(source.contains(name), "mask for tensor '{}' which is not in {}", name,
                   source.description());
    const io::TensorInfo& info = source.info(name);
    SYMPRUNE_CHECK(info.shape.size() == 2 && info.shape[0] == mask.rows && info.shape[1] == mask.cols &&
                       mask.bits.size() == static_cast<size_t>((mask.rows * mask.cols + 7) / 8),
                   "mask [{}, {}] does not fit tensor '{}' of shape {} in {}", mask.rows, mask.cols, name,
                   shape_to_string(info.shape), source.location(name));
  }
  const std::vector<io::TensorSource::Shard> shards = source.shards();

  // Rank 0 stages the directory; every rank learns its path (outputs live on a file system all ranks see).
  std::unique_ptr<io::StagedDirectory> staging;
  std::string tmp_name;
  agree_on_errors(comm, [&] {
    if (root) {
      staging = out->stage();
      tmp_name = staging->path().string();
    }
  });
  int64_t length = static_cast<int64_t>(tmp_name.size());
  if (comm.size() > 1) {
    comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&length, 1)), 0);
    tmp_name.resize(static_cast<size_t>(length));
    comm.broadcast(std::as_writable_bytes(std::span<char>(tmp_name.data(), tmp_name.size())), 0);
  }
  const fs::path tmp = tmp_name;
  auto as_target = [&](const std::string& message) {
    // Name out/..., not the staged directory that is removed on the way out.
    const std::string from = tmp.string(), to = out ? out->path().string() : from;
    std::string m = message;
    for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + to.size()))
      m.replace(at, from.size(), to);
    return m;
  };

  // Shard i is written by rank i mod R: the same bytes whoever writes them. Every rank takes part in every
  // round, so that a signal on any rank stops all of them between shards (with several ranks the local
  // checks are off and only agreed stops count).
  WrittenModel written;
  std::map<std::string, int64_t> zeros;
  for (const auto& entry : masks.shapes()) zeros[entry.first] = 0;  // the same keys on every rank
  const size_t ranks = static_cast<size_t>(comm.size());
  std::vector<const io::TensorSource::Shard*> mine;
  for (size_t i = static_cast<size_t>(comm.rank()); i < shards.size(); i += ranks) mine.push_back(&shards[i]);
  WriteProgress progress(source, mine);
  for (size_t round = 0; round * ranks < shards.size(); ++round) {
    agree_on_interrupts(comm);
    agree_on_errors(comm, [&] {
      const size_t i = round * ranks + static_cast<size_t>(comm.rank());
      if (i >= shards.size()) return;
      try {
        interrupt::check();
        write_shard(source, shards[i], masks.kept(), tmp / shards[i].file, zeros, progress);
      } catch (const interrupt::Interrupted&) {
        throw;
      } catch (const Error& e) {
        throw Error(as_target(e.what()));
      }
    });
  }
  for (const auto& shard : shards) written.files.push_back(shard.file);
  // Each masked tensor is in one shard, written by one rank: the sum over ranks is its count.
  std::vector<int64_t> zero_counts;
  for (const auto& entry : zeros) zero_counts.push_back(entry.second);
  comm.all_reduce_sum(zero_counts);
  auto count = zero_counts.begin();
  for (auto& entry : zeros) entry.second = *count++;
  written.zeros = std::move(zeros);

  fault::at("shards_written", comm.rank());
  agree_on_interrupts(comm);  // the last stop before the output is installed
  agree_on_errors(comm, [&] {
    if (!root) return;
    try {
      if (!input_dir.empty())
        for (auto& name : copy_other_files(input_dir, tmp, source, shards))
          written.files.push_back(std::move(name));
      if (source.indexed()) {
        io::write_file_atomically(tmp / io::kSafetensorsIndexFile, index_json(source, shards));
        written.files.push_back(io::kSafetensorsIndexFile);
      }
      for (const auto& [name, contents] : extra_files) {
        io::write_file_atomically(tmp / name, contents);
        written.files.push_back(name);
      }
      io::write_provenance(tmp, provenance);
      written.files.push_back(io::kProvenanceFile);
      fault::at("before_install");
      interrupt::check();
      out->check_replaceable(/*again=*/true);
      out->check_inputs_unchanged();
      staging->install();
    } catch (const interrupt::Interrupted&) {
      throw;
    } catch (const Error& e) {
      throw Error(as_target(e.what()));
    }
  });
  std::sort(written.files.begin(), written.files.end());
  written.files.erase(std::unique(written.files.begin(), written.files.end()), written.files.end());
  return written;
}

}  // namespace symprune::engine
