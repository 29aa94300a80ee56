// The NCCL communicator (DESIGN.md §4): the only file besides src/core/cuda that includes CUDA or
// NCCL headers. Host spans are staged through one fixed device buffer (kNcclStagingBytes) on a private
// stream; the chunked communicator around it keeps every message within that buffer.
#include "dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace symprune::dist {
namespace {

#define SYMPRUNE_NCCL_CUDA_CHECK(expression)                                                         \
  do {                                                                                               \
    const cudaError_t status_ = (expression);                                                        \
    if (status_ != cudaSuccess) {                                                                    \
      (void)cudaGetLastError();                                                                      \
      ::symprune::fail("CUDA error at {}:{}: `{}` failed: {} ({})", __FILE__, __LINE__, #expression, \
                       cudaGetErrorString(status_), cudaGetErrorName(status_));                      \
    }                                                                                                \
  } while (0)

// One checking macro per foreign API (DESIGN.md §7.3): expression, file:line, rank and NCCL's text.
#define SYMPRUNE_NCCL_CHECK(expression)                                                                 \
  do {                                                                                                  \
    const ncclResult_t status_ = (expression);                                                          \
    if (status_ != ncclSuccess) {                                                                       \
      ::symprune::fail("NCCL error at {}:{} on rank {}: `{}` failed: {} {}", __FILE__, __LINE__, rank_, \
                       #expression, ncclGetErrorString(status_), ncclGetLastError(nullptr));            \
    }                                                                                                   \
  } while (0)

class NcclCommunicator final : public Communicator {
 public:
  // Every step that can fail on one rank alone (no unique id, no device, no stream, no memory for the
  // staging buffer) is agreed on before ncclCommInitRank, which waits for all ranks: a rank that failed
  // there would leave the others waiting.
  NcclCommunicator(Communicator& bootstrap, int device)
      : bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()) {
    // NCCL connects its peers (and allocates its device buffers) at its first collective unless told
    // otherwise; connected at init, they are taken before the memory plan reads the free memory. Set
    // before any NCCL call: ncclGetUniqueId (rank 0 only) already reads nccl.conf, whose values NCCL
    // applies only where the environment has none, so every rank must see this one first. A value in the
    // environment stays.
    (void)::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    ncclUniqueId id{};
    std::string failed;
    const auto attempt = [&](const std::function<void()>& step) {
      if (!failed.empty()) return;
      try {
        step();
      } catch (const Error& e) {
        failed = e.what();
      }
    };
    if (rank_ == 0) attempt([&] { SYMPRUNE_NCCL_CHECK(ncclGetUniqueId(&id)); });
    bootstrap.broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
    attempt([&] { SYMPRUNE_NCCL_CUDA_CHECK(cudaSetDevice(device)); });
    attempt([&] { SYMPRUNE_NCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); });
    attempt([&] { SYMPRUNE_NCCL_CUDA_CHECK(cudaMalloc(&staging_, kNcclStagingBytes)); });
    if (const auto failure = first_failure(bootstrap, failed.empty() ? 0 : 1, failed)) {
      if (staging_ != nullptr) (void)cudaFree(staging_);
      if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
      fail("NCCL setup failed on rank {} (of {}): {}", failure->rank, size_, failure->message);
    }
    // From here on a failing rank cannot reach the others, which may be waiting for it inside NCCL where
    // no agreement gets to them: it ends the job (MPI_Abort) with its message.
    if (const ncclResult_t init = ncclCommInitRank(&comm_, size_, id, rank_); init != ncclSuccess)
      abort_setup("ncclCommInitRank", init);
    connect_chain_peers();
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (staging_ != nullptr) (void)cudaFree(staging_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(std::span<double> values) override {
    reduce(values.data(), values.size(), ncclFloat64);
  }
  void all_reduce_sum(std::span<float> values) override { reduce(values.data(), values.size(), ncclFloat32); }
  void all_reduce_sum(std::span<int64_t> values) override { reduce(values.data(), values.size(), ncclInt64); }

  void broadcast(std::span<std::byte> bytes, int root) override {
    SYMPRUNE_CHECK(root >= 0 && root < size_,
                   "broadcast: root {} is not a rank of the nccl communicator (size {})", root, size_);
    if (bytes.empty()) return;
    void* device = staging(bytes.size());
    copy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    SYMPRUNE_NCCL_CHECK(ncclBroadcast(device, device, bytes.size(), ncclUint8, root, comm_, stream_));
    copy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost);
  }

  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) override {
    const size_t expected = local.size() * static_cast<size_t>(size_);
    SYMPRUNE_CHECK(gathered.size() == expected,
                   "all_gather: output has {} bytes, expected {} ({} ranks x {} bytes)", gathered.size(),
                   expected, size_, local.size());
    if (expected == 0) return;
    auto* device = static_cast<std::byte*>(staging(expected));
    std::byte* mine = device + local.size() * static_cast<size_t>(rank_);
    copy(mine, local.data(), local.size(), cudaMemcpyHostToDevice);
    SYMPRUNE_NCCL_CHECK(ncclAllGather(mine, device, local.size(), ncclUint8, comm_, stream_));
    copy(gathered.data(), device, expected, cudaMemcpyDeviceToHost);
  }

  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    const std::vector<size_t> offsets = gather_offsets(counts, size_, rank_, local.size(), gathered.size());
    if (offsets.back() == 0) return;
    auto* device = static_cast<std::byte*>(staging(offsets.back()));
    copy(device + offsets[rank_], local.data(), local.size(), cudaMemcpyHostToDevice);
    // NCCL has no all-gather-v: one broadcast per rank, fused into a single group launch.
    SYMPRUNE_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      if (counts[r] == 0) continue;
      std::byte* slot = device + offsets[r];
      SYMPRUNE_NCCL_CHECK(
          ncclBroadcast(slot, slot, static_cast<size_t>(counts[r]), ncclUint8, r, comm_, stream_));
    }
    SYMPRUNE_NCCL_CHECK(ncclGroupEnd());
    copy(gathered.data(), device, offsets.back(), cudaMemcpyDeviceToHost);
  }

  void send(std::span<const std::byte> bytes, int dest) override {
    check_peer(dest, "send");
    if (bytes.empty()) return;
    void* device = staging(bytes.size());
    copy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    SYMPRUNE_NCCL_CHECK(ncclSend(device, bytes.size(), ncclUint8, dest, comm_, stream_));
    SYMPRUNE_NCCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void recv(std::span<std::byte> bytes, int source) override {
    check_peer(source, "recv");
    if (bytes.empty()) return;
    void* device = staging(bytes.size());
    SYMPRUNE_NCCL_CHECK(ncclRecv(device, bytes.size(), ncclUint8, source, comm_, stream_));
    copy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost);
  }

  void barrier() override {
    int64_t token = 0;
    all_reduce_sum(std::span<int64_t>(&token, 1));
  }

  [[noreturn]] void abort(int exit_code) override {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    bootstrap_.abort(exit_code);
    std::abort();  // not reached: a virtual call does not carry [[noreturn]]
  }

 private:
  // NCCL_RUNTIME_CONNECT=0 connects the collectives' rings and trees at init, but point-to-point peers
  // only at their first send/recv. The pipeline's ordered reductions pass a running total from each rank
  // to the next (engine/ordered_reduce.cc): one byte along that chain now takes those connections' buffers
  // before the memory plan reads the free memory.
  void connect_chain_peers() {
    if (size_ < 2) return;
    ncclResult_t status = ncclGroupStart();
    if (status == ncclSuccess && rank_ > 0)
      status = ncclRecv(staging_, 1, ncclUint8, rank_ - 1, comm_, stream_);
    if (status == ncclSuccess && rank_ + 1 < size_)
      status = ncclSend(staging_, 1, ncclUint8, rank_ + 1, comm_, stream_);
    if (const ncclResult_t end = ncclGroupEnd(); status == ncclSuccess) status = end;
    if (status == ncclSuccess && cudaStreamSynchronize(stream_) != cudaSuccess)
      status = ncclUnhandledCudaError;
    if (status != ncclSuccess) abort_setup("connecting the ordered reductions' peers", status);
  }

  [[noreturn]] void abort_setup(const char* step, ncclResult_t status) {
    std::fprintf(stderr, "symprune_dist: error: NCCL setup failed on rank %d (of %d): %s: %s %s\n", rank_,
                 size_, step, ncclGetErrorString(status), ncclGetLastError(comm_));
    // NCCL hands out the communicator before its setup can fail: release a half-made one too.
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    bootstrap_.abort(1);
    std::abort();  // not reached, as in abort()
  }

  void check_peer(int peer, const char* what) const {
    SYMPRUNE_CHECK(peer >= 0 && peer < size_ && peer != rank_,
                   "{}: rank {} is not another rank of the nccl "
                   "communicator (size {}, this is rank {})",
                   what, peer, size_, rank_);
  }

  template <typename T>
  void reduce(T* values, size_t count, ncclDataType_t type) {
    if (count == 0) return;
    void* device = staging(count * sizeof(T));
    copy(device, values, count * sizeof(T), cudaMemcpyHostToDevice);
    SYMPRUNE_NCCL_CHECK(ncclAllReduce(device, device, count, type, ncclSum, comm_, stream_));
    copy(values, device, count * sizeof(T), cudaMemcpyDeviceToHost);
  }

  // The chunked communicator around this one keeps every message within the buffer.
  void* staging(size_t bytes) const {
    SYMPRUNE_ASSERT(bytes <= kNcclStagingBytes,
                    "nccl: a message of {} bytes exceeds the {}-byte staging buffer", bytes,
                    kNcclStagingBytes);
    return staging_;
  }

  // Stream-ordered after the collective; synchronous so the host span is ready on return.
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    SYMPRUNE_NCCL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    SYMPRUNE_NCCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Communicator& bootstrap_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
};

}  // namespace

bool compiled_with_nccl() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return make_chunked_communicator(std::make_unique<NcclCommunicator>(bootstrap, device), kNcclStagingBytes);
}

}  // namespace symprune::dist
