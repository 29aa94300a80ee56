#pragma once
// The narrow compute interface the model runs on (DESIGN.md §7.2): a handful of fp32 ops on Tensors,
// host tensors for the CPU backend (src/core/cpu, OpenBLAS + OpenMP; the specification), tensors in
// device memory for a device-resident backend (the CUDA one, src/core/cuda), which keeps its device types
// out of this header.
//
// Shapes: a "matrix" argument is any tensor viewed as [numel / dim(-1), dim(-1)] (rows = tokens).
// Outputs are resized by the op (Tensor::resize keeps the buffer when the shape already matches, so a
// reused output tensor causes no allocation).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/activation_stats.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/scores.h"
#include "core/tensor.h"

namespace symprune {

// llama3 rope_scaling parameters (transformers' _compute_llama3_parameters).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// RoPE inverse frequencies inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, rounded to fp32 as
// transformers computes them, then rescaled by llama3 scaling when given.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta,
                                 const std::optional<Llama3RopeScaling>& scaling = std::nullopt);

// cos and sin of the RoPE angles, [seq_len, half] row-major each, as every backend applies them: the angle
// inv_freq[i] · t in fp32 (as transformers forms it), its cos/sin in fp64 rounded to fp32.
struct RopeTables {
  std::vector<float> cos, sin;
};
RopeTables rope_tables(std::span<const float> inv_freq, int64_t seq_len);

// Which part of a weight Backend::mask_weight keeps: W̃ (the pruned entries set to zero) or W − W̃ (the
// kept entries set to zero; what the reconstruction error multiplies).
enum class MaskedPart { kKept, kPruned };

// Memory of a device backend, in bytes. held: what its allocator holds now for the backend's own allocations,
// in use or kept for reuse (not free on the device, yet available to them). peak_used: the most the
// backend's own allocations held at once since the last reset_device_memory_peak; peak_reserved: the most
// device memory its allocator held for them then (at least peak_used: a pool's unused and fragmented
// memory). What libraries allocate on their own, the cuBLAS workspaces and NCCL's buffers, is in none.
struct DeviceMemory {
  int64_t free = 0, total = 0, held = 0, peak_used = 0, peak_reserved = 0;
  // false: the device has no stream-ordered pools (some virtualized GPUs), so every free of device memory
  // waits for the whole device: what a timing must know.
  bool pooled = true;
};

// Device memory a 16-bit attention's tile of fp32 scores and 16-bit probabilities may take (the memory
// plan counts it).
constexpr int64_t kAttentionTileBytes = int64_t{256} << 20;

// Device scratch a device backend's refine_dsnot may take at most (the memory plan counts it).
constexpr int64_t kDeviceRefineScratchBytes = int64_t{64} << 20;

// The device buffer through which a 16-bit tensor crosses the bus as fp32 (checkpoints, resume), in
// chunks of this size, never a full-size fp32 copy (the memory plan counts it).
constexpr int64_t kDeviceConvertBytes = int64_t{32} << 20;

// What the libraries of a device backend allocate on their own, which the memory plan counts too: the
// cuBLAS workspace of each of its two handles (fp32 and 16-bit), 32 MiB each on Hopper (cuBLAS's
// recommended size, cublasSetWorkspace).
constexpr int64_t kDeviceLibraryBytes = int64_t{2} * (int64_t{32} << 20);

// Shape of a batch of equal-length sequences for attention/rope: rows are ordered
// [seq 0 positions 0..T-1, seq 1 positions 0..T-1, ...].
struct SequenceBatch {
  int64_t n_seqs = 1;
  int64_t seq_len = 0;
  int64_t rows() const { return n_seqs * seq_len; }
};

// Where Backend::first_non_finite found a NaN or ±Inf: the flat index and the value.
struct NonFiniteEntry {
  int64_t index = 0;
  float value = 0.0f;
};

// Runs `score` (the scores of a part of a matrix) and then MatrixPart::agree_on_scores with its error, if
// `part` has one: how each backend's score_and_select scores before selecting.
void score_part_agreed(const MatrixPart* part, const std::function<void()>& score);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Whether the ops take and give tensors in device memory (Tensor::on_device) instead of host tensors.
  virtual bool device_resident() const { return false; }
  // Returns once the work of every op called so far has finished. A host backend's ops finish before they
  // return; a device backend's are queued and run later, so a caller that reports how far work is (a
  // progress line) waits here first.
  virtual void synchronize() {}
  // The element dtypes this backend's tensors may have: fp32 everywhere; a device backend also stores
  // bf16/fp16 (a run in lower precision, DESIGN.md §6.1). Only linear's weight, copy_rows, add_into_rows'
  // destination, copy_rows_rms_norm's source, duplicate, to_host, score_and_select and mask_weight accept a
  // tensor of another dtype than fp32.
  virtual bool supports_dtype(DType dtype) const { return dtype == DType::kF32; }
  // `host` (fp32) in this backend's memory with elements of `dtype` (rounded to nearest even); a host
  // backend returns it as is.
  virtual Tensor to_backend(Tensor host, DType dtype);
  Tensor to_backend(Tensor host) { return to_backend(std::move(host), DType::kF32); }
  // A tensor of this backend from the stored bytes of a model file: `shape` elements of weight dtype
  // `dtype` (little-endian, any alignment). A host backend converts them to fp32; a device backend uploads
  // them as they are (a tensor of `dtype`: half the bytes of fp32 for a bf16/fp16 file).
  virtual Tensor from_stored(std::vector<int64_t> shape, DType dtype, std::span<const std::byte> bytes);
  // An fp32 host copy of a tensor of this backend (a host backend returns a copy).
  virtual Tensor to_host(const Tensor& tensor) { return tensor; }
  // A tensor of `shape` and `dtype` in this backend's memory: zero-filled on a host backend, unspecified
  // values on a device backend (nothing is uploaded).
  virtual Tensor allocate(std::vector<int64_t> shape, DType dtype);
  Tensor allocate(std::vector<int64_t> shape) { return allocate(std::move(shape), DType::kF32); }
  // A copy of `tensor` (this backend's memory, the same dtype) that shares no storage with it (copies of a
  // device tensor share its memory).
  Tensor duplicate(const Tensor& tensor);
  // `tensor` itself when it is in host memory, else a host copy of it kept in `copy` (host code reads a
  // tensor of either kind without copying a host one).
  const Tensor& host_view(const Tensor& tensor, Tensor& copy);
  // `tensor` itself when it is fp32, else an fp32 copy of it in this backend's memory kept in `copy` (the
  // ops that read fp32 only, given a bf16/fp16 tensor).
  const Tensor& fp32_view(const Tensor& tensor, Tensor& copy);
  // dst rows [dst_row, dst_row + rows) = src rows [src_row, src_row + rows); both viewed as
  // [*, width] with the same width, dst already sized; converted when their dtypes differ (to fp32 exactly,
  // from fp32 rounded to nearest even).
  virtual void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) = 0;

  // y[M, m] = x[M, n] · W[m, n]ᵀ (+ bias[m] when bias is non-null and non-empty). A bf16/fp16 weight
  // (device backends) multiplies x rounded to its dtype, accumulating in fp32; y is fp32.
  virtual void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) = 0;
  // `read_as` below (rms_norm, rope, silu_mul, attention's output): how the caller reads the op's fp32 result
  // until it is rewritten. kF32: as fp32. bf16/fp16 (device backends, a run in lower precision): every read
  // rounds it to that dtype (a linear with a weight of it, attention's operands of it), so a device backend
  // may keep only the rounded values and skip writing the fp32 ones; reading them afterwards is a caller's
  // bug (asserted). A host backend writes fp32 regardless.
  // y = x / sqrt(mean(x²) + eps) · weight, per row (LLaMA RMSNorm; variance in fp32 as HF does).
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                        DType read_as = DType::kF32) = 0;
  // y = (x − mean) / sqrt(var + eps) · weight + bias, per row; weight/bias may be null (no affine).
  virtual void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps,
                          Tensor& y) = 0;
  // In-place rotate-half RoPE on x [rows, n_heads·head_dim]; row r has position r % seq_len.
  // head_dim = 2·inv_freq.size().
  virtual void rope(Tensor& x, const SequenceBatch& batch, int64_t n_heads, std::span<const float> inv_freq,
                    DType read_as = DType::kF32) = 0;
  // Causal attention per sequence, grouped-query: q [rows, n_heads·hd], k/v [rows, n_kv_heads·hd],
  // query head h reads kv head h / (n_heads / n_kv_heads). out [rows, n_heads·hd].
  // scores = scale · q·kᵀ, softmax over keys ≤ query position. `operands` bf16/fp16 (device backends, a
  // run in lower precision): q, k, v and the probabilities are rounded to it for the two products, which
  // accumulate in fp32 (tensor cores; score tiles within kAttentionTileBytes); out stays fp32 (`read_as`:
  // see rms_norm).
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceBatch& batch,
                         int64_t n_heads, int64_t n_kv_heads, float scale, Tensor& out,
                         DType operands = DType::kF32, DType read_as = DType::kF32) = 0;
  // out = silu(gate) · up, elementwise.
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out, DType read_as = DType::kF32) = 0;
  virtual void relu(Tensor& x) = 0;
  // x += y (same element count).
  virtual void add(Tensor& x, const Tensor& y) = 0;
  // The residual stream's fused steps (a device backend saves a pass over x each):
  // x += residual, then y = rms_norm(x) as rms_norm (y is neither x nor residual). The default runs the two.
  virtual void add_rms_norm(Tensor& x, const Tensor& residual, const Tensor& weight, float eps, Tensor& y,
                            DType read_as = DType::kF32);
  // x = src rows [src_row, src_row + rows of x) converted to fp32 (as copy_rows), then y = rms_norm(x) as
  // rms_norm (y is neither x nor src): a micro-batch's first norm, on its stored rows. The default runs the
  // two.
  virtual void copy_rows_rms_norm(const Tensor& src, int64_t src_row, Tensor& x, const Tensor& weight,
                                  float eps, Tensor& y, DType read_as = DType::kF32);
  // dst rows [dst_row, dst_row + rows of x) = x + y (x's element count, viewed as [*, width] like
  // copy_rows), converted to dst's dtype as copy_rows converts; x is unchanged unless dst is x (dst_row 0).
  virtual void add_into_rows(const Tensor& x, const Tensor& y, Tensor& dst, int64_t dst_row) = 0;
  // out[i, :] = table[ids[i], :]; ids must be in range (checked by the caller).
  virtual void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out) = 0;
  // out[i, :] = table[row_offset + (i % seq_len), :] added to x (OPT learned positions).
  virtual void add_position_rows(Tensor& x, const Tensor& table, const SequenceBatch& batch,
                                 int64_t row_offset) = 0;

  // --- The pruning pipeline's ops (DESIGN.md §3.1–3.3, perplexity). The defaults are the host
  // specification on host tensors (ActivationStats::accumulate, compute_scores + select_mask, Mask,
  // the fp64 row NLL); a device-resident backend overrides them to work in its memory with the same
  // results, and only statistics vectors, packed masks and per-row figures cross to the host.

  // The statistics of one call of seqs · seq_len tokens: input [rows, n], output [rows, m] or null
  // (no output statistic), the output's bias [m] or null (subtracted: the statistic is of X Wᵀ). Same
  // order and errors as ActivationStats::accumulate on a fresh object.
  virtual ActivationStats activation_stats(const Tensor& input, const Tensor* output,
                                           const Tensor* output_bias, int64_t seqs, int64_t seq_len);
  // The mask of rows [options.row_begin, options.row_end) of `weight` [m, n] (this backend's memory):
  // select_mask(compute_scores(...)) with the same rules, errors and results (for a bf16/fp16 weight, those
  // of its fp32 values).
  virtual Mask score_and_select(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                                const ScoreOptions& options, const MaskSpec& spec, const MatrixPart* part);
  // The Gram matrix XᵀX [n, n] of the rows of x [rows, n] (fp32, this backend's memory), as an fp32 host
  // tensor: one matrix product with fp32 accumulation. The default transposes x on the host and calls
  // linear (the CPU's specification); a device backend multiplies in its memory and returns only the
  // n × n result.
  virtual Tensor gram(const Tensor& x);
  // A new tensor in this backend's memory, of weight's dtype: `weight` [rows, n] with the entries of one
  // part of `mask` (the same shape) set to zero (MaskedPart).
  virtual Tensor mask_weight(const Tensor& weight, const Mask& mask, MaskedPart keep);
  // refine_dsnot (core/refine_dsnot.h) of `weight` [rows, n] (this backend's memory; a bf16/fp16 weight
  // is refined on its fp32 values), with the same mask, totals and errors.
  virtual RefineStats refine_dsnot(const Tensor& weight, const std::vector<double>& mu,
                                   const std::vector<double>& var, const std::vector<double>& act_norm,
                                   Mask& mask, const DsnotOptions& options, std::optional<NmPattern> nm,
                                   const std::vector<double>* column_l1);
  // initial_column_l1 (core/refine_dsnot.h) of `weight` (this backend's memory) under `mask`.
  virtual std::vector<double> initial_column_l1(const Tensor& weight, const Mask& mask);
  // −log softmax(logits[r])[targets[r]] in fp64 for every row of logits [rows, vocab] (this backend's
  // memory); targets are in [0, vocab) (checked by the caller).
  virtual std::vector<double> row_nll(const Tensor& logits, std::span<const int32_t> targets);
  // The first NaN or ±Inf of `tensor` (this backend's memory, any dtype it stores) in row-major order, with
  // its value; nothing when every entry is finite.
  virtual std::optional<NonFiniteEntry> first_non_finite(const Tensor& tensor);
  // Free and total memory of a device backend; nullopt for a host backend (host memory is the system's).
  virtual std::optional<DeviceMemory> device_memory() { return std::nullopt; }
  // Starts DeviceMemory::peak_used again from the memory in use now (nothing for a host backend).
  virtual void reset_device_memory_peak() {}
};

// Checks copy_rows' arguments (the same width, rows inside both tensors; a broken invariant aborts) and
// returns that width; for Backend implementations.
int64_t copy_rows_width(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows);

// The process-wide CPU backend (OpenBLAS sgemm for every matrix product, OpenMP for the rest).
Backend& cpu_backend();
// Address space one CPU thread takes under `ulimit -v`: OpenBLAS's 128 MiB buffer (mapped when the
// thread starts, or at the first product for the calling thread) and a 64 MiB malloc arena.
inline constexpr double kBlasThreadAddressSpace = 192.0 * (1 << 20);
// What a run of `threads` CPU threads maps for BLAS and heaps beyond its data under `ulimit -v`: a
// kBlasThreadAddressSpace per thread and 64 MiB of helper threads' stacks and heaps (the allowance of prune's
// memory plan and of the CPU backend's check before its first product).
inline double blas_address_space_bytes(int threads) {
  return static_cast<double>(threads) * kBlasThreadAddressSpace + (64 << 20);
}
// Threads used by the CPU backend (OpenMP and OpenBLAS); 0 leaves the defaults (one per CPU). Throws
// symprune::Error (naming --threads) outside 0..max_cpu_threads().
void set_cpu_threads(int n);
int max_cpu_threads();
int cpu_threads();
// OpenMP's thread count belongs to the thread that set it: a thread the run starts (the next block's reader)
// would otherwise run its parallel loops on one thread per CPU, beside the run's own --threads (several
// ranks on a node then oversubscribe it). Such a thread calls this first with the starter's cpu_threads().
void set_cpu_threads_of_this_thread(int n);

}  // namespace symprune
