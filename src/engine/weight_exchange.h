#pragma once
// Block weights for the pipeline (DESIGN.md §4): storage is read once per block, not once per rank. Each
// rank reads a share of the block's tensors (balanced by bytes, largest first) from the model's
// TensorSource, the ranks exchange them (one broadcast per tensor from its reader, in the stored dtype),
// and every rank installs the block in its model: converted to fp32 on a host backend, uploaded in the
// stored dtype on a device backend (Backend::from_stored; the model converts on the device what it keeps
// in another dtype). The next block's share is read on a background thread while the current block
// computes (with one rank it is also converted there on a host backend, or uploaded from pinned memory on
// the device backend's upload stream, so that installing it is all that is left on the critical path);
// the exchange itself happens on the calling thread, so only it talks to the communicator.
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/decoder_model.h"

namespace symprune::engine {

class BlockWeightExchange {
 public:
  BlockWeightExchange(dist::Communicator& comm, model::DecoderModel& model);
  ~BlockWeightExchange();
  BlockWeightExchange(const BlockWeightExchange&) = delete;
  BlockWeightExchange& operator=(const BlockWeightExchange&) = delete;

  // Collective: installs block `block` in the model (model::DecoderModel::set_block_weights); then, when
  // `next` is a block index, starts reading this rank's share of it in the background.
  void load(int64_t block, int64_t next = -1);

  int64_t bytes_read() const { return bytes_read_; }            // this rank, from storage
  int64_t bytes_exchanged() const { return bytes_exchanged_; }  // this rank, in broadcasts

 private:
  struct Planned {
    io::ExpectedTensor expected;
    std::string stored;  // the name in the TensorSource
    int owner = 0;
    size_t bytes = 0;
  };
  // This rank's share of a block: the stored bytes by stored name, and with one rank (nothing to
  // exchange) the backend's tensors by expected name instead.
  struct Share {
    std::map<std::string, std::vector<std::byte>> bytes;
    std::map<std::string, Tensor> values;
  };
  std::vector<Planned> plan(int64_t block) const;
  Share read_share(int64_t block) const;

  dist::Communicator& comm_;
  model::DecoderModel& model_;
  int64_t prefetched_block_ = -1;
  std::future<Share> prefetch_;
  // With one rank, every tensor is read into this one buffer and handed to the backend from it (a fresh
  // buffer per tensor faulted in the block's hundreds of megabytes of pages again for every block, and
  // the read of the next 7B block outlasted a block's compute on an H100). Only read_share uses it, and
  // read_share never runs twice at once (load waits for the prefetch first).
  mutable std::vector<std::byte> read_buffer_;
  int64_t bytes_read_ = 0, bytes_exchanged_ = 0;
};

}  // namespace symprune::engine
