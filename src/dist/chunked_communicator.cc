// Collectives in bounded rounds (see communicator.h): every message `inner` sees holds at most the limit,
// so an implementation that stages messages through a buffer of that size (NCCL's device buffer) never
// allocates more, whatever the size of a model's tensors.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace symprune::dist {
namespace {

class ChunkedCommunicator final : public Communicator {
 public:
  ChunkedCommunicator(std::unique_ptr<Communicator> inner, size_t max_message_bytes)
      : inner_(std::move(inner)), limit_(max_message_bytes) {
    SYMPRUNE_CHECK(inner_ != nullptr, "chunked communicator: no communicator to wrap");
    const size_t ranks = static_cast<size_t>(inner_->size());
    SYMPRUNE_CHECK(limit_ >= std::max<size_t>(ranks, sizeof(double)),
                   "chunked communicator: messages of at most {} bytes cannot hold one byte from each of {} "
                   "ranks and one 8-byte value",
                   limit_, ranks);
    gather_round_ = limit_ / ranks;
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }

  void all_reduce_sum(std::span<double> values) override { reduce(values); }
  void all_reduce_sum(std::span<float> values) override { reduce(values); }
  void all_reduce_sum(std::span<int64_t> values) override { reduce(values); }

  void broadcast(std::span<std::byte> bytes, int root) override {
    if (bytes.empty()) return inner_->broadcast(bytes, root);  // still checks root
    for (size_t first = 0; first < bytes.size(); first += limit_)
      inner_->broadcast(bytes.subspan(first, std::min(limit_, bytes.size() - first)), root);
  }

  // Round i gathers bytes [i·c, (i+1)·c) of every rank's part (c = limit / ranks) into a round buffer,
  // whose pieces go to their places in `gathered`.
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) override {
    const size_t ranks = static_cast<size_t>(size()), part = local.size();
    // Whole (or wrong: the inner communicator's own error) in one message.
    if (part <= gather_round_ || gathered.size() != part * ranks) return inner_->all_gather(local, gathered);
    const auto round = round_buffer(gather_round_ * ranks);
    for (size_t first = 0; first < part; first += gather_round_) {
      const size_t length = std::min(gather_round_, part - first);
      const std::span<std::byte> received(round.get(), length * ranks);
      inner_->all_gather(local.subspan(first, length), received);
      for (size_t r = 0; r < ranks; ++r)
        std::memcpy(gathered.data() + r * part + first, received.data() + r * length, length);
    }
  }

  // Round i gathers bytes [i·c, (i+1)·c) of every rank's part, as far as each part reaches.
  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    const std::vector<size_t> offsets = gather_offsets(counts, size(), rank(), local.size(), gathered.size());
    const size_t ranks = static_cast<size_t>(size());
    if (offsets.back() <= limit_) return inner_->all_gather_v(local, counts, gathered);
    const size_t longest = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
    const auto round = round_buffer(gather_round_ * ranks);
    std::vector<int64_t> round_counts(ranks);
    for (size_t first = 0; first < longest; first += gather_round_) {
      size_t total = 0;
      for (size_t r = 0; r < ranks; ++r) {
        const size_t count = static_cast<size_t>(counts[r]);
        round_counts[r] = static_cast<int64_t>(first < count ? std::min(gather_round_, count - first) : 0);
        total += static_cast<size_t>(round_counts[r]);
      }
      const size_t mine = static_cast<size_t>(round_counts[static_cast<size_t>(rank())]);
      const std::span<std::byte> received(round.get(), total);
      inner_->all_gather_v(local.subspan(std::min(first, local.size()), mine), round_counts, received);
      size_t at = 0;
      for (size_t r = 0; r < ranks; ++r) {
        const size_t length = static_cast<size_t>(round_counts[r]);
        if (length > 0) std::memcpy(gathered.data() + offsets[r] + first, received.data() + at, length);
        at += length;
      }
    }
  }

  // The receiver cuts the same rounds from the same size (recv takes exactly what was sent).
  void send(std::span<const std::byte> bytes, int dest) override {
    if (bytes.empty()) return inner_->send(bytes, dest);
    for (size_t first = 0; first < bytes.size(); first += limit_)
      inner_->send(bytes.subspan(first, std::min(limit_, bytes.size() - first)), dest);
  }
  void recv(std::span<std::byte> bytes, int source) override {
    if (bytes.empty()) return inner_->recv(bytes, source);
    for (size_t first = 0; first < bytes.size(); first += limit_)
      inner_->recv(bytes.subspan(first, std::min(limit_, bytes.size() - first)), source);
  }

  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(int exit_code) override {
    inner_->abort(exit_code);
    std::abort();  // not reached: a virtual call does not carry [[noreturn]]
  }

 private:
  // Host memory for one gather round, left uninitialized (every byte read is received first).
  static std::unique_ptr<std::byte[]> round_buffer(size_t bytes) {
    return std::make_unique_for_overwrite<std::byte[]>(bytes);
  }

  // Element-wise sums: each round is a run of whole elements, each element summed once.
  template <typename T>
  void reduce(std::span<T> values) {
    const size_t per_round = limit_ / sizeof(T);
    if (values.size() <= per_round) return inner_->all_reduce_sum(values);
    for (size_t first = 0; first < values.size(); first += per_round)
      inner_->all_reduce_sum(values.subspan(first, std::min(per_round, values.size() - first)));
  }

  std::unique_ptr<Communicator> inner_;
  size_t limit_ = 0;
  size_t gather_round_ = 0;  // bytes of each rank's part per all-gather round
};

}  // namespace

std::unique_ptr<Communicator> make_chunked_communicator(std::unique_ptr<Communicator> inner,
                                                        size_t max_message_bytes) {
  return std::make_unique<ChunkedCommunicator>(std::move(inner), max_message_bytes);
}

}  // namespace symprune::dist
