#pragma once
// Where a model's tensors come from: the safetensors files of a directory (io/safetensors.h), a PyTorch
// checkpoint (io/torch_checkpoint.h) or the seeded synthetic models (io/synthetic_model.h). The model, the
// pipeline and the pruned-model writer see only this interface.
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace symprune::io {

struct TensorInfo;  // io/safetensors.h

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  virtual bool contains(std::string_view name) const = 0;
  virtual std::vector<std::string> names() const = 0;  // sorted
  // Throws "missing tensor 'X' in ..." when absent.
  virtual const TensorInfo& info(std::string_view name) const = 0;
  // Where the tensor is stored, for messages: its file, or "synthetic:llama2-7b:0".
  virtual std::string location(std::string_view name) const = 0;
  // Where the tensors are listed: model.safetensors, the index file, or "synthetic:llama2-7b:0".
  virtual std::string description() const = 0;
  // The stored bytes of `name` (info(name).dtype, row-major) into `out`, resized. For files this is the
  // storage read; for synthetic models the generation.
  virtual void read_bytes(std::string_view name, std::vector<std::byte>& out) const = 0;
  // fp32 copy; when `expected_shape` is given, a mismatch throws naming the tensor, its location and both
  // shapes.
  virtual Tensor load_f32(std::string_view name, const std::vector<int64_t>* expected_shape = nullptr) const;

  // The layout of a copy of this model: shard files (names relative to the model directory), each with
  // its tensors in file order and its metadata. `indexed`: the files are listed by
  // model.safetensors.index.json.
  struct Shard {
    std::string file;
    std::vector<std::string> tensors;
    std::map<std::string, std::string> metadata;
  };
  virtual std::vector<Shard> shards() const = 0;
  virtual bool indexed() const = 0;
  // Files of the input directory read as weights that a pruned copy replaces by other files (a PyTorch
  // checkpoint written as safetensors): the writer leaves them out without a warning. Empty when the
  // copy's shards are the input's own files, or for generated models.
  virtual std::vector<std::string> input_weight_files() const { return {}; }
};

}  // namespace symprune::io
