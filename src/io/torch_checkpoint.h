#pragma once
// PyTorch checkpoints (`torch.save` of a state dict, the zip format of torch >= 1.6: pytorch_model.bin, or
// its shards with pytorch_model.bin.index.json), read without running any of their code.
//
// The file is a zip archive of stored (uncompressed) records: PREFIX/data.pkl, a pickle of the state dict,
// and PREFIX/data/KEY, the raw little-endian bytes of each storage. The pickle is not executed: a small
// interpreter reads the opcodes a state dict uses and builds only what a state dict holds (dicts, tuples,
// lists, strings, numbers). It calls nothing; the only globals it accepts are the ones `torch.save` writes
// for tensors (collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter,
// torch.<Type>Storage), and any other global refuses the file, naming it. This is the same allow-list idea
// as `torch.load(weights_only=True)`, narrower. Tensors may share storages and be strided views of them
// (tied weights, transposes); their bytes are gathered into row-major order when read.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io/tensor_source.h"

namespace symprune::io {

// The single-file name and the index of a sharded PyTorch checkpoint (transformers' names).
inline constexpr const char* kTorchSingleFile = "pytorch_model.bin";
inline constexpr const char* kTorchIndexFile = "pytorch_model.bin.index.json";

// Whether a file's first bytes begin a raw pickle (protocol 2 to 5): a PyTorch checkpoint of torch < 1.6,
// which wrote a sequence of pickles and raw storages (torch >= 1.6 writes a zip archive).
bool starts_like_pickle(std::span<const std::byte> head);

// One stored record of a zip archive: its name and where its bytes lie in the archive.
struct ZipRecord {
  std::string name;
  uint64_t offset = 0;  // of the record's first byte, from the archive's start
  uint64_t size = 0;
};

// The records of a zip archive held in `archive` (the whole file), read from its central directory
// (ZIP64 included). Every record must be stored uncompressed and lie inside the archive; `where` names the
// file in errors.
std::vector<ZipRecord> read_zip_records(std::span<const std::byte> archive, const std::string& where);

// One tensor of an unpickled state dict: a view of `storage` (elements of `dtype`, starting at element
// `storage_offset`, with `shape` and `stride` in elements).
struct TorchTensorRef {
  std::string name;
  std::string storage;  // the storage's record key: data/KEY
  DType dtype = DType::kF32;
  int64_t storage_numel = 0;  // elements the storage holds, as the pickle says
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

// Largest data.pkl read; most objects it may build (a state dict needs about 20 per tensor); most
// dimensions of one tensor, and of all its tensor records and of all its entries together (a tensor counts
// its dimensions plus one). So a pickle cannot make the reader hold more than a few hundred MB, whatever it
// holds, while a state dict of 100,000 tensors is read.
inline constexpr uint64_t kMaxTorchPickleBytes = 64ull << 20;
inline constexpr size_t kMaxTorchPickleObjects = size_t{2} << 20;
inline constexpr size_t kMaxTorchTensorDims = 64;
inline constexpr size_t kMaxTorchDimsInAll = size_t{1} << 20;

// The tensors of the state dict pickled in `pickle` (data.pkl), in the dict's order. Refuses (Error naming
// `where`) any opcode or global outside the allow-list above, a top-level object that is not a dict of
// tensors, pickles beyond the caps above, and malformed or
// truncated pickles.
std::vector<TorchTensorRef> unpickle_state_dict(std::span<const std::byte> pickle, const std::string& where);

// One mmapped PyTorch zip checkpoint. Move-only; unmaps on destruction.
class TorchCheckpointFile {
 public:
  static TorchCheckpointFile open(const std::filesystem::path& path);
  TorchCheckpointFile(TorchCheckpointFile&&) noexcept;
  TorchCheckpointFile& operator=(TorchCheckpointFile&&) noexcept;
  ~TorchCheckpointFile();

  const std::filesystem::path& path() const { return path_; }
  // In the state dict's order; data_begin/data_end span the tensor's elements in the archive.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // The tensor's bytes in row-major order into `out` (resized); a strided view is gathered.
  void read_bytes(const TensorInfo& info, std::vector<std::byte>& out) const;

 private:
  TorchCheckpointFile() = default;
  struct View {
    uint64_t storage_begin = 0;  // archive offset of the storage's first byte
    uint64_t storage_end = 0;    // and one past its last
    int64_t storage_offset = 0;  // elements
    std::vector<int64_t> stride;
    bool contiguous = true;
  };
  std::filesystem::path path_;
  MappedFile map_;
  std::vector<TensorInfo> tensors_;
  std::vector<View> views_;  // parallel to tensors_
  std::map<std::string, size_t, std::less<>> index_;
};

// All weights of a directory holding pytorch_model.bin, or the shards that pytorch_model.bin.index.json
// names. A pruned copy is written as safetensors: pytorch_model.bin becomes model.safetensors, and
// pytorch_model-0000i-of-0000n.bin becomes model-0000i-of-0000n.safetensors with
// model.safetensors.index.json.
class TorchModel : public TensorSource {
 public:
  static std::unique_ptr<TorchModel> open_dir(const std::filesystem::path& dir);

  bool contains(std::string_view name) const override;
  std::vector<std::string> names() const override;
  const TensorInfo& info(std::string_view name) const override;
  std::string location(std::string_view name) const override;
  std::string description() const override;
  void read_bytes(std::string_view name, std::vector<std::byte>& out) const override;
  std::vector<Shard> shards() const override;
  bool indexed() const override { return indexed_; }
  std::vector<std::string> input_weight_files() const override;

 private:
  const TorchCheckpointFile& file_of(std::string_view name) const;
  std::filesystem::path dir_;
  bool indexed_ = false;
  std::vector<std::string> file_names_;  // as in the directory or the index, parallel to files_
  std::vector<std::unique_ptr<TorchCheckpointFile>> files_;
  std::map<std::string, size_t, std::less<>> location_;  // tensor name -> index into files_
};

// The files TorchModel reads in `dir`, relative to it: pytorch_model.bin, or the index and each shard it
// names once (io::index_shard_names; an unreadable index gives itself only: TorchModel::open_dir reports it).
std::vector<std::filesystem::path> torch_weight_files(const std::filesystem::path& dir);

// Whether `dir` holds a PyTorch checkpoint that TorchModel reads (pytorch_model.bin or its index) and no
// safetensors weights (which take precedence, as in transformers).
bool has_torch_checkpoint(const std::filesystem::path& dir);

// The weights of a model directory: safetensors when present, else a PyTorch checkpoint (TorchModel), else
// the safetensors reader's error (which names what the directory holds instead).
std::unique_ptr<TensorSource> open_weights_dir(const std::filesystem::path& dir);

}  // namespace symprune::io
