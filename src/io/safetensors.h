#pragma once
// safetensors reading (mmap, single file or sharded with model.safetensors.index.json) and
// atomic writing. Format: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, data.
// Every header is validated before use: size cap, offsets inside the data section, no overlap,
// shape x dtype size == byte length, known dtype, shard names confined to the model directory.
// Tensors of any byte-sized safetensors dtype are read as bytes; only F32/F16/BF16 convert to fp32.
// A file that shrinks while mapped (truncated during a run) is reported as an Error, never a SIGBUS.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/mapped_file.h"
#include "io/tensor_source.h"

namespace symprune::io {

// Largest JSON header accepted (the reference implementation uses 100 MB as well).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // offsets within the data section (after the header)
  uint64_t data_end = 0;
  int64_t numel() const;
};

// One mmapped safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file (offset) order
  const TensorInfo* find(std::string_view name) const;                 // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes in the mapping. Throws when the file no longer holds them (it shrank since open).
  std::span<const std::byte> bytes(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  MappedFile map_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Runs `read`, which reads from a mapping of `file`; a SIGBUS it raises because the file shrank under
// the mapping becomes symprune::Error naming `file`. `read` must own no objects with destructors (it is
// left by siglongjmp). Calls may nest and run on several threads.
void read_mapped(const std::filesystem::path& file, const std::function<void()>& read);
// Drops the pages of `mapped` (a span of a SafetensorsFile's mapping) from this process's memory.
void release_pages(std::span<const std::byte> mapped);

// Throws unless `info` is in a weight dtype (F32, F16, BF16), naming the tensor, the file and the dtype.
void check_weight_dtype(const SafetensorsFile& file, const TensorInfo& info);

// A shard file name from an index (`index_path`) must stay inside the model directory: throws for an empty,
// absolute or '..' name. Lexical on purpose: Hugging Face cache snapshots hold symlinks into ../../blobs.
void check_confined_shard_name(const std::string& name, const std::filesystem::path& index_path);

// The index of a sharded model directory (its "weight_map" names each tensor's shard).
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

// The shard files an index (`index`: a model.safetensors.index.json or pytorch_model.bin.index.json) names in
// its weight_map, each once, lexically normalized and sorted; none when it cannot be read. Nothing is
// validated (the model readers report a bad index).
std::vector<std::filesystem::path> index_shard_names(const std::filesystem::path& index);

// The shard files that the index of `dir` names (as written there, relative to `dir`), each once; empty when
// the directory has model.safetensors (which takes precedence) or no index. Nothing is validated: an
// unreadable index gives none (SafetensorsModel::open_dir reports it).
std::vector<std::filesystem::path> indexed_shard_files(const std::filesystem::path& dir);

// All weights of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json. A directory with only pickle files (pytorch_model.bin, *.pt) is refused with
// a hint; io::open_weights_dir reads pytorch_model.bin with TorchModel instead (io/torch_checkpoint.h).
class SafetensorsModel : public TensorSource {
 public:
  static SafetensorsModel open_dir(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  bool contains(std::string_view name) const override;
  std::vector<std::string> names() const override;  // sorted
  // Throws "missing tensor 'X' in DIR" when absent.
  const TensorInfo& info(std::string_view name) const override;
  const SafetensorsFile& file_of(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;
  // Reads and converts to fp32; when `expected_shape` is given, a mismatch throws naming the tensor,
  // the file and both shapes.
  Tensor load_f32(std::string_view name, const std::vector<int64_t>* expected_shape = nullptr) const override;
  // Metadata of the first file (all shards written by symprune carry the same).
  const std::map<std::string, std::string>& metadata() const;
  // The shard file each tensor lives in, as written in the index (file name relative to dir).
  std::map<std::string, std::string> weight_map() const;

  // TensorSource: the file path; a copy of the mapped bytes; the input's own shards.
  std::string location(std::string_view name) const override;
  std::string description() const override;
  void read_bytes(std::string_view name, std::vector<std::byte>& out) const override;
  std::vector<Shard> shards() const override;
  bool indexed() const override { return sharded_; }

 private:
  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> location_;  // tensor name -> index into files_
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // must be numel * dtype_size bytes
};

// Writes one safetensors file atomically (temp name in the same dir, fsync, rename). Tensors are
// written in the given order, 8-byte-aligned header as the reference writer does.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata);
// The same file, with each tensor's bytes produced by fill(i, buffer) just before it is written (the
// `bytes` spans are ignored): one tensor in memory at a time, whatever the file's size.
void write_safetensors_streamed(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t index, std::vector<std::byte>& bytes)>& fill);

// Writes `tensors` into `dir` as model.safetensors, or, when they exceed `max_shard_bytes`,
// as model-0000i-of-0000n.safetensors plus model.safetensors.index.json (Hugging Face naming).
// Returns the written file names (relative to dir).
std::vector<std::string> write_safetensors_sharded(const std::filesystem::path& dir,
                                                   const std::vector<TensorToWrite>& tensors,
                                                   const std::map<std::string, std::string>& metadata,
                                                   uint64_t max_shard_bytes);

}  // namespace symprune::io
