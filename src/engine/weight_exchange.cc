#include "engine/weight_exchange.h"

#include <algorithm>
#include <span>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/model_layout.h"
#include "io/safetensors.h"

namespace symprune::engine {

BlockWeightExchange::BlockWeightExchange(dist::Communicator& comm, model::DecoderModel& model)
    : comm_(comm), model_(model) {}

BlockWeightExchange::~BlockWeightExchange() {
  if (prefetch_.valid()) prefetch_.wait();  // an error in it has nowhere to go now
}

std::vector<BlockWeightExchange::Planned> BlockWeightExchange::plan(int64_t block) const {
  const io::TensorSource& source = model_.tensors();
  std::vector<Planned> tensors;
  for (const auto& e : io::expected_block_tensors(model_.config(), block)) {
    const auto stored = io::stored_tensor_name(source, e.name);
    SYMPRUNE_CHECK(stored.has_value(), "missing tensor '{}' in {}", e.name, source.description());
    const io::TensorInfo& info = source.info(*stored);
    SYMPRUNE_CHECK(info.shape == e.shape, "tensor '{}' in {} has shape {} but {} implies {}", *stored,
                   source.location(*stored), shape_to_string(info.shape), model_.config_file(),
                   shape_to_string(e.shape));
    tensors.push_back({e, *stored, 0, static_cast<size_t>(info.numel() * dtype_size(info.dtype))});
  }
  // Largest first, each to the rank with the fewest bytes so far (ties: the lower rank, then the name).
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].bytes > tensors[b].bytes; });
  std::vector<size_t> load(static_cast<size_t>(comm_.size()), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    tensors[i].owner = static_cast<int>(least - load.begin());
    *least += tensors[i].bytes;
  }
  return tensors;
}

// A stored tensor's bytes as a tensor of the model's backend (Backend::from_stored: fp32 on the host, the
// stored dtype on a device).
Tensor backend_tensor(const model::DecoderModel& model, const std::string& stored,
                      const io::ExpectedTensor& expected, std::span<const std::byte> bytes) {
  return model.backend().from_stored(expected.shape, model.tensors().info(stored).dtype, bytes);
}

BlockWeightExchange::Share BlockWeightExchange::read_share(int64_t block) const {
  Share share;
  const bool one_rank = comm_.size() == 1;
  for (const Planned& t : plan(block)) {
    if (t.owner != comm_.rank()) continue;
    std::vector<std::byte>& bytes = one_rank ? read_buffer_ : share.bytes[t.stored];
    model_.tensors().read_bytes(t.stored, bytes);
    SYMPRUNE_ASSERT(bytes.size() == t.bytes, "{}: {} bytes, expected {}", t.stored, bytes.size(), t.bytes);
    // With one rank the tensor reaches the backend here, off the critical path: a host backend converts it
    // to fp32, a device backend uploads it on its own stream (Backend::from_stored) while the current
    // block computes; the buffer is kept for the next tensor. With several ranks the bytes are exchanged
    // first, on the calling thread.
    if (one_rank) share.values.emplace(t.expected.name, backend_tensor(model_, t.stored, t.expected, bytes));
  }
  return share;
}

void BlockWeightExchange::load(int64_t block, int64_t next) {
  Share share;
  if (prefetch_.valid() && prefetched_block_ == block) {
    share = prefetch_.get();
  } else {
    if (prefetch_.valid()) prefetch_.get();
    share = read_share(block);
  }
  prefetch_ = {};
  const std::vector<Planned> tensors = plan(block);
  std::map<std::string, Tensor>& values = share.values;
  for (const Planned& t : tensors) {
    if (t.owner == comm_.rank()) bytes_read_ += static_cast<int64_t>(t.bytes);
    if (values.contains(t.expected.name)) continue;  // read and converted with the share (one rank)
    std::vector<std::byte>& bytes = share.bytes[t.stored];
    if (t.owner != comm_.rank()) bytes.resize(t.bytes);
    if (comm_.size() > 1) {
      comm_.broadcast(bytes, t.owner);
      bytes_exchanged_ += static_cast<int64_t>(t.bytes);
    }
    values.emplace(t.expected.name, backend_tensor(model_, t.stored, t.expected, bytes));
    std::vector<std::byte>().swap(bytes);  // released once the backend holds the tensor
  }
  model_.set_block_weights(
      block, model::assemble_block_weights(model_.config(), block, [&](const io::ExpectedTensor& e) {
        return std::move(values.at(e.name));
      }));
  if (next >= 0 && next < model_.num_blocks()) {
    prefetched_block_ = next;
    prefetch_ = std::async(std::launch::async, [this, next, threads = cpu_threads()] {
      set_cpu_threads_of_this_thread(threads);
      return read_share(next);
    });
  }
}

}  // namespace symprune::engine
