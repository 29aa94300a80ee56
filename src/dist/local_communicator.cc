// The size-1 communicator: collectives reduce to copies, but argument checks are the same as in the
// multi-rank implementations so that misuse is caught in single-process tests too.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "dist/communicator.h"

namespace symprune::dist {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }

  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_sum(std::span<float>) override {}
  void all_reduce_sum(std::span<int64_t>) override {}

  void broadcast(std::span<std::byte>, int root) override {
    SYMPRUNE_CHECK(root == 0, "broadcast: root {} is not a rank of the local communicator (size 1)", root);
  }

  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) override {
    SYMPRUNE_CHECK(gathered.size() == local.size(),
                   "all_gather: output has {} bytes, expected {} (1 rank x {} bytes)", gathered.size(),
                   local.size(), local.size());
    std::copy(local.begin(), local.end(), gathered.begin());
  }

  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    gather_offsets(counts, 1, 0, local.size(), gathered.size());
    std::copy(local.begin(), local.end(), gathered.begin());
  }

  void send(std::span<const std::byte>, int dest) override {
    fail("send: rank {} does not exist in the local communicator (size 1)", dest);
  }
  void recv(std::span<std::byte>, int source) override {
    fail("recv: rank {} does not exist in the local communicator (size 1)", source);
  }

  void barrier() override {}

  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace symprune::dist
