#pragma once
// The one seam between algorithms and inter-process communication (DESIGN.md §4): algorithms see
// `Communicator&`, never mpi.h or nccl.h. Implementations: local (size 1, here), MPI and NCCL
// (later, in src/dist only). All collectives are blocking and must be called by every rank in the
// same order with the same sizes; results never depend on the number of ranks beyond the reduction
// order of floating-point sums.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace symprune::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi", "nccl": for logs and reports.
  virtual std::string name() const = 0;

  // In place: on return every rank holds the element-wise sum over ranks. The statistics of
  // DESIGN.md §3.1 are fp64 sums; float is for partial norms, int64 for histograms and counts.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual void all_reduce_sum(std::span<float> values) = 0;
  virtual void all_reduce_sum(std::span<int64_t> values) = 0;

  // In place: on return every rank holds root's bytes. Throws symprune::Error if root is not a rank.
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;

  // Every rank contributes `local` (the same size on every rank); `gathered` (size() * local.size()
  // bytes) receives the contributions in rank order. Throws symprune::Error on a size mismatch.
  virtual void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) = 0;

  // Uneven contributions (row partitions that do not divide evenly): counts[r] is the number of
  // bytes rank r contributes, known to all ranks; `gathered` holds their sum, in rank order.
  // Throws symprune::Error when counts.size() != size(), local.size() != counts[rank()] or
  // gathered.size() != the sum of counts.
  virtual void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                            std::span<std::byte> gathered) = 0;

  // Point to point, blocking: send `bytes` to rank `dest`; receive exactly bytes.size() bytes from rank
  // `source`. Messages between two ranks arrive in the order they were sent.
  virtual void send(std::span<const std::byte> bytes, int dest) = 0;
  virtual void recv(std::span<std::byte> bytes, int source) = 0;

  virtual void barrier() = 0;

  // Ends every rank's process with `exit_code`, for an error that not every rank sees (MPI_Abort): no rank
  // is left waiting in a collective.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// all_gather_v's arguments checked (the messages every implementation gives): counts.size() == size,
// counts >= 0, counts[rank] == local_bytes, gathered_bytes == Σ counts. Returns the byte offset of each
// rank's part, with the total at the end (size + 1 entries).
std::vector<size_t> gather_offsets(std::span<const int64_t> counts, int size, int rank, size_t local_bytes,
                                   size_t gathered_bytes);

// A rank's failure, as every rank learns it from first_failure.
struct RankFailure {
  int rank = 0;
  int64_t status = 0;
  std::string message;
};

// Collective: each rank gives its status (0: fine) and, if not fine, its message. Returns, on every rank,
// the lowest rank whose status is not 0 with its status and message, or nothing when all are fine. How
// ranks that fail alone end together instead of leaving the others waiting in a collective.
std::optional<RankFailure> first_failure(Communicator& comm, int64_t status, const std::string& message);

// A single-process communicator: size 1, rank 0, every collective is the identity (a copy for the
// gathers); send/recv have no peer and throw. Used by `symprune` (one process) and by tests.
std::unique_ptr<Communicator> make_local_communicator();

// `inner`, with every collective passed on in rounds whose messages hold at most max_message_bytes (an
// all-gather: the bytes gathered in a round, from all ranks), for an implementation that stages messages
// through a fixed buffer of that size (NCCL's device buffer). The results are those of `inner`: byte for
// byte for broadcast, the gathers and send/recv; an all-reduce sums each element once, as `inner` does.
// Throws symprune::Error when max_message_bytes is below max(ranks, 8) (a round of one byte per rank,
// one 8-byte value).
std::unique_ptr<Communicator> make_chunked_communicator(std::unique_ptr<Communicator> inner,
                                                        size_t max_message_bytes);

}  // namespace symprune::dist
