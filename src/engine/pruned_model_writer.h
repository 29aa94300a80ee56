#pragma once
// Writes a pruned copy of a Hugging Face model directory (DESIGN.md §3.5 step 5):
//  * every tensor keeps its stored name, dtype, shape and shard; for pruned linears the pruned entries
//    are zero bits (exactly +0.0 in F32/F16/BF16), every other byte is the input's byte;
//  * each output shard holds the same tensors, in the same order, as the input shard of the same name;
//    a sharded input's model.safetensors.index.json is copied as is (same names, same weight_map, same
//    total_size); shard metadata is the input's plus {"format": "pt"} when absent;
//  * every other top-level file (config.json, tokenizer files, generation_config.json, ...) is copied
//    byte-identical; other weight formats (pytorch_model*.bin, *.pt, *.pth, *.ckpt, *.h5, *.msgpack) and
//    subdirectories are not copied; the input's own symprune_provenance.json (an input that is itself a
//    symprune output) is replaced by this run's;
//  * everything is written into a temporary directory beside `out` and renamed to `out` at the end, so
//    on any error or interrupt nothing appears at `out` (and an existing `out` replaced under --force
//    stays intact); the checks, the lock and the atomic replace are io::OutputDirectory's.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/masks.h"
#include "dist/communicator.h"
#include "io/output_dir.h"
#include "io/tensor_source.h"

namespace symprune::engine {

// A mask kept bit-packed (Mask::pack_bits layout: flat index i is bit i % 8 of byte i / 8), so the
// masks of a whole model cost one bit per weight until they are written.
struct PackedMask {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bits;
  static PackedMask of(const Mask& mask) { return {mask.rows(), mask.cols(), mask.pack_bits()}; }
  // The same from a mask no longer needed: a packed mask's bits are moved, not copied.
  static PackedMask of(Mask&& mask) {
    const int64_t rows = mask.rows(), cols = mask.cols();
    return {rows, cols, std::move(mask).release_bits()};
  }
  bool pruned(int64_t flat_index) const {
    return (bits[static_cast<size_t>(flat_index >> 3)] >> (flat_index & 7)) & 1;
  }
};

// The masks of a model's pruned tensors, kept until the output is written. Every rank records each mask's
// shape, but keeps its bits only on the rank that writes the tensor's shard (shard i: rank i mod R, as
// write_pruned_model writes them), so a whole model's masks cost a rank about 1/R bit per weight (at 70B,
// 8.5 GB on every rank otherwise), and each rank saves and restores its own in a checkpoint. A mask's bits
// never change once added: a checkpoint's writer thread reads them while later masks are added.
class ModelMasks {
 public:
  struct Shape {
    int64_t rows = 0, cols = 0;
    int64_t bytes() const { return (rows * cols + 7) / 8; }
  };
  // `source`: the model the masks are of (its shards decide the keepers); this rank of `ranks`.
  ModelMasks(const io::TensorSource& source, int rank, int ranks);

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // The rank that writes the shard holding tensor `name` of the source, and keeps its mask.
  int keeper(const std::string& name) const;
  bool is_tensor(const std::string& name) const { return keepers_.count(name) > 0; }
  // Whether `shape` is the shape of tensor `name` of the source (a matrix).
  bool fits(const std::string& name, Shape shape) const;
  bool keeps(const std::string& name) const { return keeper(name) == rank_; }

  // Records the mask of tensor `name`: its shape on every rank, its bits on the keeper only.
  void add(const std::string& name, PackedMask mask);
  // Records the shape of a mask another rank keeps (read from a checkpoint's index).
  void add_shape(const std::string& name, Shape shape);

  const std::map<std::string, Shape>& shapes() const { return shapes_; }   // every mask, by name
  const std::map<std::string, PackedMask>& kept() const { return kept_; }  // this rank's
  // The bytes this rank keeps of the masks of `names` (tensors of the source), before any is added.
  int64_t kept_bytes(const std::vector<std::pair<std::string, Shape>>& names) const;

 private:
  int rank_ = 0, ranks_ = 1;
  const io::TensorSource* source_ = nullptr;
  std::map<std::string, int> keepers_;  // every tensor of the source
  std::map<std::string, Shape> shapes_;
  std::map<std::string, PackedMask> kept_;
};

// What write_pruned_model wrote: the file names (relative to out, sorted) and, per masked tensor, how
// many of its entries are zero in the copy (the pruned ones and the weights that were zero already; -0.0
// counts), summed over ranks: the sparsity of the model as written.
struct WrittenModel {
  std::vector<std::string> files;
  std::map<std::string, int64_t> zeros;
};

// Collective over `comm`. `source` holds the model's tensors (its shards() are the files written; shard i is
// written by rank i mod R into the directory rank 0 stages, so outputs must be on a file system every rank
// sees); `input_dir` (empty for a synthetic model) gives the other files to copy; `out` is rank 0's output
// directory (nullptr on the other ranks). masks: stored tensor name → mask over that tensor's [rows,
// cols], each rank holding the bits of the tensors it writes. `extra_files` (name → contents) are written too
// (a synthetic model's config.json), `provenance` as io::kProvenanceFile. A failure on any rank fails every
// rank with its message and leaves nothing.
WrittenModel write_pruned_model(dist::Communicator& comm, const io::TensorSource& source,
                                const std::filesystem::path& input_dir, const io::OutputDirectory* out,
                                const ModelMasks& masks,
                                const std::map<std::string, std::string>& extra_files,
                                const nlohmann::json& provenance);

}  // namespace symprune::engine
