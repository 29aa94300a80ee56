// The MPI communicator (DESIGN.md §4): the only file that includes mpi.h. Collectives on host buffers,
// split into pieces of at most 1 GiB because MPI counts are int.
#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/error.h"

namespace symprune::dist {
namespace {

constexpr size_t kMaxMessage = size_t{1} << 30;

// One checking macro per foreign API (DESIGN.md §7.3): expression, file:line, rank and MPI's text.
#define SYMPRUNE_MPI_CHECK(expression)                                                                     \
  do {                                                                                                     \
    const int status_ = (expression);                                                                      \
    if (status_ != MPI_SUCCESS) {                                                                          \
      char text_[MPI_MAX_ERROR_STRING];                                                                    \
      int length_ = 0;                                                                                     \
      MPI_Error_string(status_, text_, &length_);                                                          \
      ::symprune::fail("MPI error at {}:{} on rank {}: `{}` failed: {}", __FILE__, __LINE__, world_rank(), \
                       #expression, std::string(text_, static_cast<size_t>(length_)));                     \
    }                                                                                                      \
  } while (0)

int world_rank() {
  int initialized = 0, rank = -1;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<int64_t>() {
  return MPI_INT64_T;
}

class MpiWorld final : public MpiCommunicator {
 public:
  MpiWorld(int* argc, char*** argv) {
    int initialized = 0;
    SYMPRUNE_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      SYMPRUNE_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
      owns_init_ = true;
    }
    // Errors come back as codes (checked above) instead of MPI's default abort without a message.
    SYMPRUNE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    SYMPRUNE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    SYMPRUNE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm node;
    SYMPRUNE_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    SYMPRUNE_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    SYMPRUNE_MPI_CHECK(MPI_Comm_size(node, &local_size_));
    MPI_Comm_free(&node);
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_init_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(std::span<double> values) override { reduce(values); }
  void all_reduce_sum(std::span<float> values) override { reduce(values); }
  void all_reduce_sum(std::span<int64_t> values) override { reduce(values); }

  void broadcast(std::span<std::byte> bytes, int root) override {
    SYMPRUNE_CHECK(root >= 0 && root < size_,
                   "broadcast: root {} is not a rank of the mpi communicator (size {})", root, size_);
    for (size_t at = 0; at < bytes.size(); at += kMaxMessage) {
      const size_t n = std::min(kMaxMessage, bytes.size() - at);
      SYMPRUNE_MPI_CHECK(MPI_Bcast(bytes.data() + at, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD));
    }
  }

  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) override {
    const size_t expected = local.size() * static_cast<size_t>(size_);
    SYMPRUNE_CHECK(gathered.size() == expected,
                   "all_gather: output has {} bytes, expected {} ({} ranks x {} bytes)", gathered.size(),
                   expected, size_, local.size());
    std::vector<int64_t> counts(static_cast<size_t>(size_), static_cast<int64_t>(local.size()));
    all_gather_v(local, counts, gathered);
  }

  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    const std::vector<size_t> offsets = gather_offsets(counts, size_, rank_, local.size(), gathered.size());
    std::copy(local.begin(), local.end(), gathered.begin() + static_cast<std::ptrdiff_t>(offsets[rank_]));
    if (offsets.back() <= static_cast<size_t>(std::numeric_limits<int>::max())) {
      std::vector<int> sizes(counts.size()), displacements(counts.size());
      for (size_t r = 0; r < counts.size(); ++r) {
        sizes[r] = static_cast<int>(counts[r]);
        displacements[r] = static_cast<int>(offsets[r]);
      }
      SYMPRUNE_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gathered.data(), sizes.data(),
                                        displacements.data(), MPI_BYTE, MPI_COMM_WORLD));
      return;
    }
    // Beyond int offsets: each rank's part as its own broadcast.
    for (int r = 0; r < size_; ++r)
      broadcast(gathered.subspan(offsets[static_cast<size_t>(r)],
                                 static_cast<size_t>(counts[static_cast<size_t>(r)])),
                r);
  }

  void send(std::span<const std::byte> bytes, int dest) override {
    check_peer(dest, "send");
    for (size_t at = 0; at < bytes.size(); at += kMaxMessage) {
      const size_t n = std::min(kMaxMessage, bytes.size() - at);
      SYMPRUNE_MPI_CHECK(
          MPI_Send(bytes.data() + at, static_cast<int>(n), MPI_BYTE, dest, kTag, MPI_COMM_WORLD));
    }
  }

  void recv(std::span<std::byte> bytes, int source) override {
    check_peer(source, "recv");
    for (size_t at = 0; at < bytes.size(); at += kMaxMessage) {
      const size_t n = std::min(kMaxMessage, bytes.size() - at);
      SYMPRUNE_MPI_CHECK(MPI_Recv(bytes.data() + at, static_cast<int>(n), MPI_BYTE, source, kTag,
                                  MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
  }

  void barrier() override { SYMPRUNE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
  }

 private:
  static constexpr int kTag = 7331;

  void check_peer(int peer, const char* what) const {
    SYMPRUNE_CHECK(peer >= 0 && peer < size_ && peer != rank_,
                   "{}: rank {} is not another rank of the mpi communicator (size {}, this is rank {})", what,
                   peer, size_, rank_);
  }

  template <typename T>
  void reduce(std::span<T> values) {
    const size_t per_message = kMaxMessage / sizeof(T);
    for (size_t at = 0; at < values.size(); at += per_message) {
      const size_t n = std::min(per_message, values.size() - at);
      SYMPRUNE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data() + at, static_cast<int>(n), mpi_type<T>(),
                                       MPI_SUM, MPI_COMM_WORLD));
    }
  }

  bool owns_init_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace

bool compiled_with_mpi() {
  return true;
}

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "PMI_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

std::unique_ptr<MpiCommunicator> make_mpi_communicator(int* argc, char*** argv) {
  return std::make_unique<MpiWorld>(argc, argv);
}

}  // namespace symprune::dist
