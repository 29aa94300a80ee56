// The CUDA backend (see cuda_backend.h).
#include "core/cuda/kernels/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/device_activation_stats.h"
#include "core/cuda/kernels/device_attention.h"
#include "core/cuda/kernels/device_dsnot.h"
#include "core/cuda/kernels/device_mask_selector.h"
#include "core/cuda/kernels/device_scores.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/cuda/kernels/linear.h"
#include "core/cuda/kernels/loss_kernels.h"
#include "core/cuda/kernels/mask_kernels.h"
#include "core/cuda/kernels/score_kernels.h"
#include "core/error.h"

namespace symprune::cuda {
namespace {

class DeviceStorage final : public TensorStorage {
 public:
  // Allocated in `stream`'s order (the default stream unless given).
  explicit DeviceStorage(int64_t bytes, DeviceStream stream = {}) : array_((bytes + 3) / 4, stream) {}
  void* bytes() override { return array_.data(); }

  // The fp32 contents rounded to a 16-bit dtype, for the ops of a run in lower precision that read them so
  // (a 16-bit linear's input; attention's q, k and v). The first such read rounds them here and marks the
  // storage as read rounded (rounded_dtype); from then on the kernels that rewrite it (rms_norm, silu_mul,
  // RoPE, the flash attention's output) write the rounded copy in the same pass, and further reads of the
  // same contents (the q, k and v projections of one input) take the copy. Any other write makes it stale.
  // The results are those of rounding at every read: the same values rounded the same way.
  DeviceArray<uint16_t> rounded;
  DType rounded_dtype = DType::kF32;  // kF32: never read rounded
  bool rounded_current = false;
  // Whether the fp32 contents are the last write's: false after an op whose caller reads its result only
  // rounded (Backend::rms_norm's read_as) wrote the rounded copy alone; reading them then is a caller's bug.
  bool wide_current = true;

 private:
  DeviceArray<float> array_;  // 4-byte units: aligned for every element dtype
};

DeviceStorage* device_storage(const Tensor& t) {
  return dynamic_cast<DeviceStorage*>(t.storage());
}

// t's contents were rewritten by a kernel that wrote no rounded copy.
void rounded_copy_stale(const Tensor& t) {
  if (DeviceStorage* storage = device_storage(t)) storage->rounded_current = false;
}

int64_t cols_of(const Tensor& t) {
  return t.rank() == 0 ? 1 : t.dim(-1);
}
int64_t rows_of(const Tensor& t) {
  const int64_t c = cols_of(t);
  return c == 0 ? 0 : t.numel() / c;
}

// The device memory of an input, which must be a device tensor (a host tensor here is a caller's bug) whose
// values were written (not only their rounded copy); `in` for ops that read fp32 only (it asserts the
// dtype), `in_bytes` for those that read any.
const void* in_bytes(const Tensor& t, const char* what) {
  SYMPRUNE_ASSERT(t.on_device() || t.empty(), "cuda backend: {} {} is a host tensor", what, t.shape_string());
  const DeviceStorage* storage = device_storage(t);
  SYMPRUNE_ASSERT(storage == nullptr || storage->wide_current,
                  "cuda backend: {} {} was written rounded to {} only (its caller said it reads it so)", what,
                  t.shape_string(), dtype_name(storage == nullptr ? DType::kF32 : storage->rounded_dtype));
  return t.device_bytes();
}
const float* in(const Tensor& t, const char* what) {
  in_bytes(t, what);
  return t.device_data();
}
// The fp32 memory of a tensor an op rewrites in place (it reads it first).
float* in_place(Tensor& t, const char* what) {
  in_bytes(t, what);
  return t.device_data();
}

// Makes `t` a device tensor of `shape` and `dtype` (keeps its memory when it already is one), to be
// rewritten: its rounded copy is stale.
void* out_bytes(Tensor& t, std::vector<int64_t> shape, DType dtype) {
  if (!t.on_device() || t.shape() != shape || t.dtype() != dtype) {
    const int64_t bytes = shape_numel(shape) * dtype_size(dtype);
    t = Tensor::in_device_memory(std::move(shape), std::make_shared<DeviceStorage>(bytes), dtype);
  }
  rounded_copy_stale(t);
  device_storage(t)->wide_current = true;
  return t.device_bytes();
}

// Where a kernel rewriting fp32 `t` also writes the result rounded: into t's rounded copy when t is read
// rounded, nowhere otherwise (`only`, when not kF32: the one dtype the kernel rounds to; a copy of another
// dtype is not written). The copy is stale until rounded_written after the launch, so that an op that throws
// on the way leaves no half-written copy marked current.
RoundedOutput rounded_output(const Tensor& t, DType only = DType::kF32) {
  rounded_copy_stale(t);
  DeviceStorage* storage = device_storage(t);
  if (storage == nullptr || storage->rounded_dtype == DType::kF32 ||
      (only != DType::kF32 && storage->rounded_dtype != only))
    return {};
  storage->rounded.reserve(t.numel());
  return {storage->rounded.data(), storage->rounded_dtype};
}
// After the launch that took `rounded` from rounded_output(t): t's copy is current when it was written.
void rounded_written(const Tensor& t, const RoundedOutput& rounded) {
  if (DeviceStorage* storage = device_storage(t); storage != nullptr && rounded.data != nullptr)
    storage->rounded_current = true;
}
// What an op rewriting fp32 device tensor `t` (an output already) writes, for a caller that reads the result
// as `read_as` (Backend::rms_norm): the fp32 values and, when t is read rounded, the copy rounded_output
// names; for a 16-bit read_as (of the kernel's one dtype `only` when that is set), the copy rounded to it
// alone, and `wide` null. Until rounded_written, neither is current.
struct OpOutputs {
  float* wide;
  RoundedOutput rounded;
};
OpOutputs outputs_for(Tensor& t, DType read_as, DType only = DType::kF32) {
  DeviceStorage* storage = device_storage(t);
  if (storage == nullptr || read_as == DType::kF32 || (only != DType::kF32 && read_as != only))
    return {t.device_data(), rounded_output(t, only)};
  storage->rounded_current = false;
  storage->wide_current = false;
  storage->rounded_dtype = read_as;
  storage->rounded.reserve(t.numel());
  return {nullptr, {storage->rounded.data(), read_as}};
}

// `count` elements of dst are rewritten in its dtype, the others kept: its rounded copy is stale, and rows
// of a tensor whose fp32 values were not kept would leave the others stale (a caller's bug).
void rows_rewritten(const Tensor& dst, int64_t count, const char* op) {
  rounded_copy_stale(dst);
  if (DeviceStorage* storage = device_storage(dst); storage != nullptr && !storage->wide_current) {
    SYMPRUNE_ASSERT(count == dst.numel(), "{}: {} of the {} elements of {} written rounded only", op, count,
                    dst.numel(), dst.shape_string());
    storage->wide_current = true;
  }
}

// Whether two tensors share their device memory.
bool same_storage(const Tensor& a, const Tensor& b) {
  return a.storage() != nullptr && a.storage() == b.storage();
}

// fp32 device tensor t rounded to `dtype` (bf16 or fp16): its current rounded copy, or rounded now into it.
const uint16_t* rounded_input(const Tensor& t, DType dtype, const char* what) {
  if (t.numel() == 0) return nullptr;
  DeviceStorage* storage = device_storage(t);
  SYMPRUNE_ASSERT(storage != nullptr && t.dtype() == DType::kF32,
                  "cuda backend: {} {} is not an fp32 device tensor", what, t.shape_string());
  if (storage->rounded_current && storage->rounded_dtype == dtype) return storage->rounded.data();
  storage->rounded.reserve(t.numel());
  launch_convert(in(t, what), DType::kF32, storage->rounded.data(), dtype, t.numel(), {});
  storage->rounded_dtype = dtype;
  storage->rounded_current = true;
  return storage->rounded.data();
}
float* out(Tensor& t, std::vector<int64_t> shape) {
  return static_cast<float*>(out_bytes(t, std::move(shape), DType::kF32));
}

// The address of element `index` of a device tensor.
template <typename Pointer>
Pointer element_at(Pointer base, const Tensor& t, int64_t index) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const char, char>;
  return static_cast<Byte*>(base) + index * dtype_size(t.dtype());
}

// The device helper threads use (set_cuda_backend_device); -1: the thread's own.
std::atomic<int> backend_device{-1};

// Uploads of stored weights: a stream of their own, so that a block read on a background thread reaches
// the device while the default stream computes, through a page-locked staging buffer (DMA; the driver
// would otherwise stage pageable memory itself, synchronously). One upload at a time.
class WeightUploader {
 public:
  ~WeightUploader() {
    pinned_free(staging_);
    destroy_stream(stream_);
  }
  // A device tensor of `shape` and `dtype` holding `bytes`, complete when this returns (its memory is
  // allocated in the upload stream's order, which is synchronized, so any stream may use and free it).
  Tensor upload(std::vector<int64_t> shape, DType dtype, std::span<const std::byte> bytes) {
    const std::lock_guard lock(mutex_);
    if (const int device = backend_device.load(); device >= 0) set_current_device(device);
    if (!started_) {
      stream_ = create_stream();
      staging_ = static_cast<std::byte*>(pinned_allocate(kStagingBytes));
      started_ = true;
    }
    const int64_t size = static_cast<int64_t>(bytes.size());
    Tensor device =
        Tensor::in_device_memory(std::move(shape), std::make_shared<DeviceStorage>(size, stream_), dtype);
    SYMPRUNE_ASSERT(size == device.numel() * dtype_size(dtype), "from_stored: {} bytes of {} for {}", size,
                    dtype_name(dtype), device.shape_string());
    auto* destination = static_cast<std::byte*>(device.device_bytes());
    for (int64_t offset = 0; offset < size; offset += kStagingBytes) {
      const size_t chunk = static_cast<size_t>(std::min<int64_t>(kStagingBytes, size - offset));
      std::memcpy(staging_, bytes.data() + offset, chunk);
      copy_to_device(destination + offset, staging_, chunk, stream_);
      synchronize(stream_);  // before the staging buffer is refilled
    }
    synchronize(stream_);  // the allocation, for an empty tensor
    return device;
  }

 private:
  static constexpr int64_t kStagingBytes = int64_t{64} << 20;
  std::mutex mutex_;
  bool started_ = false;
  DeviceStream stream_;
  std::byte* staging_ = nullptr;
};

// A 16-bit tensor crosses the bus as fp32 through a bounded device buffer (kDeviceConvertBytes), never a
// full-size fp32 copy: the hidden states of a checkpoint or a resume are gigabytes that the memory plan
// does not hold twice. `step(first, count, wide)` handles values first..first+count.
constexpr int64_t kConvertChunk = kDeviceConvertBytes / static_cast<int64_t>(sizeof(float));

void convert_in_chunks(int64_t numel,
                       const std::function<void(int64_t, int64_t, DeviceArray<float>&)>& step) {
  DeviceArray<float> wide(std::min(numel, kConvertChunk));
  for (int64_t first = 0; first < numel; first += kConvertChunk)
    step(first, std::min(kConvertChunk, numel - first), wide);
}

// SYMPRUNE_CUDA_PROFILE=1 (a diagnostic): every op of the backend waits for the device before it returns
// and adds its time to a table per op, printed to stderr at exit. The waits cost time themselves; an op
// called from inside another counts in the outer one only; from_stored (the weight prefetch's uploads, on
// their own thread and stream) is not profiled.
class OpProfile {
 public:
  static OpProfile& instance() {
    static OpProfile profile;
    return profile;
  }
  bool enabled() const { return enabled_; }
  void add(const char* op, double seconds) {
    const std::lock_guard lock(mutex_);
    auto& [calls, total] = ops_[op];
    ++calls;
    total += seconds;
  }
  ~OpProfile() {
    if (!enabled_ || ops_.empty()) return;
    double sum = 0.0;
    for (const auto& [op, entry] : ops_) sum += entry.second;
    std::fprintf(stderr, "cuda backend ops (SYMPRUNE_CUDA_PROFILE), %.3f s in all:\n", sum);
    for (const auto& [op, entry] : ops_)
      std::fprintf(stderr, "  %-20s %8lld calls %10.3f s %6.1f %%\n", op.c_str(),
                   static_cast<long long>(entry.first), entry.second, 100.0 * entry.second / sum);
  }

 private:
  OpProfile() {
    const char* value = std::getenv("SYMPRUNE_CUDA_PROFILE");
    enabled_ = value != nullptr && std::string_view(value) == "1";
  }
  bool enabled_ = false;
  std::mutex mutex_;
  std::map<std::string, std::pair<int64_t, double>> ops_;
};

class OpTimer {
 public:
  explicit OpTimer(const char* op)
      : op_(op),
        outermost_(OpProfile::instance().enabled() && depth_++ == 0),
        exceptions_(std::uncaught_exceptions()) {
    if (outermost_) start_ = std::chrono::steady_clock::now();
  }
  // An op that throws is not timed, and the wait never throws out of here (a fault surfaces at the op's
  // next synchronization instead).
  ~OpTimer() {
    if (!OpProfile::instance().enabled()) return;
    --depth_;
    if (!outermost_ || std::uncaught_exceptions() > exceptions_) return;
    try {
      synchronize();
    } catch (...) {
      return;
    }
    OpProfile::instance().add(
        op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  static thread_local int depth_;
  const char* op_;
  bool outermost_;
  int exceptions_;
  std::chrono::steady_clock::time_point start_;
};
thread_local int OpTimer::depth_ = 0;

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  bool device_resident() const override { return true; }
  void synchronize() override { cuda::synchronize(); }

  bool supports_dtype(DType dtype) const override { return is_weight_dtype(dtype); }

  using Backend::allocate;
  Tensor allocate(std::vector<int64_t> shape, DType dtype) override {
    const OpTimer timer("allocate");
    SYMPRUNE_ASSERT(supports_dtype(dtype), "cuda backend: tensors of dtype {}", dtype_name(dtype));
    Tensor t;
    out_bytes(t, std::move(shape), dtype);
    return t;
  }

  // Other dtypes than fp32 are converted on the device (fp32 crosses the bus, the device rounds).
  using Backend::to_backend;
  Tensor to_backend(Tensor host, DType dtype) override {
    const OpTimer timer("to_backend");
    if (host.on_device() && host.dtype() == dtype) return host;
    Tensor device = allocate(host.shape(), dtype);
    if (host.on_device()) {
      copy_rows(host, 0, device, 0, rows_of(host));
    } else if (dtype == DType::kF32) {
      if (host.numel() > 0)
        copy_to_device(device.device_data(), host.data(), static_cast<size_t>(host.numel()) * sizeof(float));
    } else {
      convert_in_chunks(host.numel(), [&](int64_t first, int64_t count, DeviceArray<float>& wide) {
        copy_to_device(wide.data(), host.data() + first, static_cast<size_t>(count) * sizeof(float));
        launch_convert(wide.data(), DType::kF32, element_at(device.device_bytes(), device, first), dtype,
                       count, {});
      });
    }
    return device;
  }

  // Safe to call from another thread than the one running the ops (the weight prefetch does).
  // Not profiled: it runs beside the ops, on the weight prefetch's thread.
  Tensor from_stored(std::vector<int64_t> shape, DType dtype, std::span<const std::byte> bytes) override {
    SYMPRUNE_ASSERT(supports_dtype(dtype), "cuda backend: tensors of dtype {}", dtype_name(dtype));
    return uploader_.upload(std::move(shape), dtype, bytes);
  }

  Tensor to_host(const Tensor& tensor) override {
    const OpTimer timer("to_host");
    if (!tensor.on_device()) return tensor;
    Tensor host(tensor.shape());
    if (host.numel() == 0) return host;
    const size_t bytes = static_cast<size_t>(host.numel()) * sizeof(float);
    if (tensor.dtype() == DType::kF32) {
      copy_to_host(host.data(), in(tensor, "to_host source"), bytes);
    } else {
      convert_in_chunks(host.numel(), [&](int64_t first, int64_t count, DeviceArray<float>& wide) {
        launch_convert(element_at(tensor.device_bytes(), tensor, first), tensor.dtype(), wide.data(),
                       DType::kF32, count, {});
        copy_to_host(host.data() + first, wide.data(), static_cast<size_t>(count) * sizeof(float));
      });
    }
    return host;
  }

  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) override {
    const OpTimer timer("copy_rows");
    const int64_t width = copy_rows_width(src, src_row, dst, dst_row, rows);
    rows_rewritten(dst, rows * width, "copy_rows");
    if (rows > 0)
      launch_convert(element_at(in_bytes(src, "copy_rows source"), src, src_row * width), src.dtype(),
                     element_at(dst.device_bytes(), dst, dst_row * width), dst.dtype(), rows * width, {});
  }

  void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override {
    const OpTimer timer("linear");
    SYMPRUNE_ASSERT(weight.rank() == 2 && cols_of(x) == weight.dim(1), "linear: input {} vs weight {}",
                    x.shape_string(), weight.shape_string());
    const int64_t m = weight.dim(0), n = weight.dim(1), rows = rows_of(x);
    // x rounded to a 16-bit weight's dtype, taken before y is made an output (y may be x): once for the
    // linears that share an input, or written by its producer.
    const uint16_t* x_rounded =
        weight.dtype() == DType::kF32 ? nullptr : rounded_input(x, weight.dtype(), "linear input");
    std::vector<int64_t> shape = x.shape();
    shape.back() = m;
    float* yd = out(y, std::move(shape));
    const bool has_bias = bias != nullptr && !bias->empty();
    const float* bias_data = has_bias ? in(*bias, "linear bias") : nullptr;
    if (weight.dtype() == DType::kF32) {
      launch_linear(in(x, "linear input"), in(weight, "linear weight"), bias_data, rows, n, m, yd, {});
      return;
    }
    launch_linear_16bit(x_rounded, in_bytes(weight, "linear weight"), weight.dtype(), bias_data, rows, n, m,
                        yd, {});
  }

  Tensor gram(const Tensor& x) override {
    const OpTimer timer("gram");
    const int64_t n = cols_of(x);
    Tensor host({n, n});
    if (n == 0) return host;
    DeviceArray<float> g(n * n);
    launch_gram(in(x, "gram input"), rows_of(x), n, g.data(), {});
    copy_to_host(host.data(), g.data(), g.bytes());
    return host;
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y, DType read_as) override {
    const OpTimer timer("rms_norm");
    SYMPRUNE_ASSERT(weight.numel() == cols_of(x), "rms_norm weight {} vs {}", weight.shape_string(),
                    x.shape_string());
    const float* xd = in(x, "rms_norm input");  // checked before y is made an output
    out(y, x.shape());
    const OpOutputs outputs = outputs_for(y, read_as);
    launch_rms_norm(xd, in(weight, "rms_norm weight"), rows_of(x), cols_of(x), eps, outputs.wide, {},
                    outputs.rounded);
    rounded_written(y, outputs.rounded);
  }

  void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y) override {
    const OpTimer timer("layer_norm");
    const bool has_weight = weight != nullptr && !weight->empty(),
               has_bias = bias != nullptr && !bias->empty();
    float* yd = out(y, x.shape());
    launch_layer_norm(in(x, "layer_norm input"), has_weight ? in(*weight, "layer_norm weight") : nullptr,
                      has_bias ? in(*bias, "layer_norm bias") : nullptr, rows_of(x), cols_of(x), eps, yd, {});
  }

  void rope(Tensor& x, const SequenceBatch& batch, int64_t n_heads, std::span<const float> inv_freq,
            DType read_as) override {
    const OpTimer timer("rope");
    const int64_t half = static_cast<int64_t>(inv_freq.size());
    SYMPRUNE_ASSERT(cols_of(x) == n_heads * 2 * half && rows_of(x) == batch.rows(), "rope on {} for {} heads",
                    x.shape_string(), n_heads);
    // The tables of the last (inv_freq, seq_len): every block of a pass asks for the same ones.
    if (batch.seq_len != rope_seq_len_ ||
        !std::equal(inv_freq.begin(), inv_freq.end(), rope_inv_freq_.begin(), rope_inv_freq_.end())) {
      const RopeTables tables = rope_tables(inv_freq, batch.seq_len);
      rope_cos_ = DeviceArray<float>(tables.cos);
      rope_sin_ = DeviceArray<float>(tables.sin);
      rope_inv_freq_.assign(inv_freq.begin(), inv_freq.end());
      rope_seq_len_ = batch.seq_len;
    }
    float* xd = in_place(x, "rope input");
    const OpOutputs outputs = outputs_for(x, read_as);
    launch_rope(xd, batch.rows(), batch.seq_len, n_heads, half, rope_cos_.data(), rope_sin_.data(), {},
                outputs.rounded, outputs.wide != nullptr);
    rounded_written(x, outputs.rounded);
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceBatch& batch,
                 int64_t n_heads, int64_t n_kv_heads, float scale, Tensor& o, DType operands,
                 DType read_as) override {
    const OpTimer timer("attention");
    const int64_t head_dim = cols_of(q) / n_heads;
    SYMPRUNE_ASSERT(
        head_dim * n_heads == cols_of(q) && cols_of(k) == n_kv_heads * head_dim && rows_of(q) == batch.rows(),
        "attention q {} k {} for {}/{} heads", q.shape_string(), k.shape_string(), n_heads, n_kv_heads);
    if (operands != DType::kF32) {
      // The operands rounded before o is made an output (o may share memory with one of them); o's rounded
      // copy is written by the kernel only when it is none of theirs (the kernel reads those while it
      // writes), and then alone when o is read rounded so (the GEMM path writes o's fp32 values anyway).
      const uint16_t* q_rounded = rounded_input(q, operands, "attention q");
      const uint16_t* k_rounded = rounded_input(k, operands, "attention k");
      const uint16_t* v_rounded = rounded_input(v, operands, "attention v");
      float* od = out(o, q.shape());
      const bool aliased = same_storage(o, q) || same_storage(o, k) || same_storage(o, v);
      const OpOutputs outputs = aliased ? OpOutputs{od, {}} : outputs_for(o, read_as, operands);
      const bool wide_written = attention_16bit_rounded(
          q_rounded, k_rounded, v_rounded, batch.n_seqs, batch.seq_len, n_heads, n_kv_heads, head_dim, scale,
          operands, attention_query_tile(n_heads, batch.seq_len, kAttentionTileBytes), attention_scratch_, od,
          outputs.rounded, AttentionPath::kAuto, outputs.wide != nullptr);
      if (wide_written) device_storage(o)->wide_current = true;
      rounded_written(o, outputs.rounded);
      return;
    }
    float* od = out(o, q.shape());
    launch_attention(in(q, "attention q"), in(k, "attention k"), in(v, "attention v"), batch.n_seqs,
                     batch.seq_len, n_heads, n_kv_heads, head_dim, scale, od, {});
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& o, DType read_as) override {
    const OpTimer timer("silu_mul");
    SYMPRUNE_ASSERT(gate.numel() == up.numel(), "silu_mul {} vs {}", gate.shape_string(), up.shape_string());
    const float *gd = in(gate, "silu gate"), *ud = in(up, "silu up");  // checked before o is an output
    out(o, gate.shape());
    const OpOutputs outputs = outputs_for(o, read_as);
    launch_silu_mul(gd, ud, gate.numel(), outputs.wide, {}, outputs.rounded);
    rounded_written(o, outputs.rounded);
  }

  void relu(Tensor& x) override {
    const OpTimer timer("relu");
    float* xd = in_place(x, "relu input");
    rounded_copy_stale(x);
    launch_relu(xd, x.numel(), {});
  }

  void add(Tensor& x, const Tensor& y) override {
    const OpTimer timer("add");
    SYMPRUNE_ASSERT(x.numel() == y.numel(), "add {} vs {}", x.shape_string(), y.shape_string());
    float* xd = in_place(x, "add destination");
    rounded_copy_stale(x);
    launch_add(xd, in(y, "add operand"), x.numel(), {});
  }

  void add_rms_norm(Tensor& x, const Tensor& residual, const Tensor& weight, float eps, Tensor& y,
                    DType read_as) override {
    const OpTimer timer("add_rms_norm");
    SYMPRUNE_ASSERT(x.numel() == residual.numel() && weight.numel() == cols_of(x),
                    "add_rms_norm {} + {}, weight {}", x.shape_string(), residual.shape_string(),
                    weight.shape_string());
    SYMPRUNE_ASSERT(!same_storage(y, x) && !same_storage(y, residual) && !same_storage(x, residual),
                    "add_rms_norm: x {}, residual and y share memory", x.shape_string());
    float* xd = in_place(x, "add_rms_norm destination");
    const float* rd = in(residual, "add_rms_norm residual");
    rounded_copy_stale(x);
    out(y, x.shape());
    const OpOutputs outputs = outputs_for(y, read_as);
    launch_add_rms_norm(xd, rd, in(weight, "rms_norm weight"), rows_of(x), cols_of(x), eps, outputs.wide, {},
                        outputs.rounded);
    rounded_written(y, outputs.rounded);
  }

  void copy_rows_rms_norm(const Tensor& src, int64_t src_row, Tensor& x, const Tensor& weight, float eps,
                          Tensor& y, DType read_as) override {
    const OpTimer timer("copy_rows_rms_norm");
    const int64_t rows = rows_of(x), width = copy_rows_width(src, src_row, x, 0, rows);
    SYMPRUNE_ASSERT(weight.numel() == width && x.dtype() == DType::kF32,
                    "copy_rows_rms_norm into {}, weight {}", x.shape_string(), weight.shape_string());
    SYMPRUNE_ASSERT(!same_storage(y, x) && !same_storage(y, src) && !same_storage(x, src),
                    "copy_rows_rms_norm: source, x {} and y share memory", x.shape_string());
    const void* source = element_at(in_bytes(src, "copy_rows_rms_norm source"), src, src_row * width);
    rows_rewritten(x, rows * width, "copy_rows_rms_norm");
    out(y, x.shape());
    const OpOutputs outputs = outputs_for(y, read_as);
    launch_widen_rms_norm(source, src.dtype(), x.device_data(), in(weight, "rms_norm weight"), rows, width,
                          eps, outputs.wide, {}, outputs.rounded);
    rounded_written(y, outputs.rounded);
  }

  void add_into_rows(const Tensor& x, const Tensor& y, Tensor& dst, int64_t dst_row) override {
    const OpTimer timer("add_into_rows");
    SYMPRUNE_ASSERT(x.numel() == y.numel(), "add_into_rows {} vs {}", x.shape_string(), y.shape_string());
    const int64_t rows = rows_of(x), width = copy_rows_width(x, 0, dst, dst_row, rows);
    const float *xd = in(x, "add_into_rows input"), *yd = in(y, "add_into_rows operand");
    rows_rewritten(dst, rows * width, "add_into_rows");
    launch_add_into(xd, yd, rows * width, element_at(dst.device_bytes(), dst, dst_row * width), dst.dtype(),
                    {});
  }

  void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& o) override {
    const OpTimer timer("embedding");
    SYMPRUNE_ASSERT(table.rank() == 2, "embedding table {}", table.shape_string());
    const int64_t d = table.dim(1), count = static_cast<int64_t>(ids.size());
    for (int32_t id : ids)
      SYMPRUNE_ASSERT(id >= 0 && id < table.dim(0), "token id {} outside [0, {})", id, table.dim(0));
    float* od = out(o, {count, d});
    const DeviceArray<int32_t> device_ids(ids.data(), count);
    launch_embedding(in(table, "embedding table"), device_ids.data(), count, d, od, {});
  }

  void add_position_rows(Tensor& x, const Tensor& table, const SequenceBatch& batch,
                         int64_t row_offset) override {
    const OpTimer timer("add_position_rows");
    const int64_t d = cols_of(x);
    SYMPRUNE_ASSERT(table.rank() == 2 && table.dim(1) == d && row_offset + batch.seq_len <= table.dim(0) &&
                        rows_of(x) == batch.rows(),
                    "position table {} for {}", table.shape_string(), x.shape_string());
    float* xd = in_place(x, "position rows destination");
    rounded_copy_stale(x);
    launch_add_position_rows(xd, in(table, "position table"), batch.rows(), batch.seq_len, row_offset, d, {});
  }

  ActivationStats activation_stats(const Tensor& input, const Tensor* output, const Tensor* output_bias,
                                   int64_t seqs, int64_t seq_len) override {
    const OpTimer timer("activation_stats");
    // The host's shape checks (the device accumulator sees pointers only), in its order.
    if (seqs > 0 && seq_len > 0) {
      checked_activation_width(input, seqs * seq_len, "input");
      if (output) checked_activation_width(*output, seqs * seq_len, "output");
    }
    const Tensor* bias = output ? output_bias : nullptr;
    check_output_bias(bias, output != nullptr, output ? cols_of(*output) : 0);
    DeviceActivationStats stats(cols_of(input), output ? cols_of(*output) : 0);
    stats.accumulate(in(input, "statistics input"), output ? in(*output, "statistics output") : nullptr, seqs,
                     seq_len, bias ? in(*bias, "statistics output bias") : nullptr);
    return stats.download();
  }

  Mask score_and_select(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                        const ScoreOptions& options, const MaskSpec& spec, const MatrixPart* part) override {
    const OpTimer timer("score_and_select");
    SYMPRUNE_ASSERT(weight.rank() == 2, "scores of weight {}", weight.shape_string());
    const int64_t m = weight.dim(0), n = weight.dim(1);
    const int64_t row_end = options.row_end < 0 ? m : options.row_end;
    const int64_t rows = std::max<int64_t>(row_end - options.row_begin, 0);
    // --compat ria's fp16 arithmetic reads the weight on the host.
    const bool needs_host = options.compat_ria_fp16;
    const Tensor host_weight = needs_host ? to_host(weight) : Tensor();
    // A bf16/fp16 weight is scored on its fp32 values (exact widening), in a temporary copy.
    Tensor widened;
    const Tensor& wide = fp32_view(weight, widened);
    DeviceArray<float> scores(rows * n);
    score_part_agreed(part, [&] {
      compute_scores_on_device(method, in(wide, "score weight"), m, n, needs_host ? &host_weight : nullptr,
                               stats, options, scores.data());
    });
    return select_mask_on_device(scores.data(), rows, n, spec, options.matrix_name, part);
  }

  std::optional<NonFiniteEntry> first_non_finite(const Tensor& tensor) override {
    const OpTimer timer("first_non_finite");
    if (!tensor.on_device()) return Backend::first_non_finite(tensor);
    if (tensor.numel() == 0) return std::nullopt;
    Tensor widened;  // a bf16/fp16 entry is NaN or infinite exactly when its fp32 widening is
    const Tensor& wide = fp32_view(tensor, widened);
    const float* values = in(wide, "first_non_finite values");
    const int64_t index = first_index_on_device(
        [&](int64_t* first) { launch_first_nonfinite(values, wide.numel(), first, {}); });
    if (index < 0) return std::nullopt;
    float value = 0.0f;
    copy_to_host(&value, values + index, sizeof value);
    return NonFiniteEntry{index, value};
  }

  Tensor mask_weight(const Tensor& weight, const Mask& mask, MaskedPart keep) override {
    const OpTimer timer("mask_weight");
    SYMPRUNE_ASSERT(weight.rank() == 2 && mask.rows() == weight.dim(0) && mask.cols() == weight.dim(1),
                    "mask {}x{} for weight {}", mask.rows(), mask.cols(), weight.shape_string());
    DeviceArray<uint8_t> upload;
    const uint8_t* bits = device_bits_of(mask, upload);  // a device selection's bits are read in place
    Tensor result;
    void* rd = out_bytes(result, weight.shape(), weight.dtype());
    launch_mask_weight(in_bytes(weight, "masked weight"), dtype_size(weight.dtype()), bits, weight.numel(),
                       keep == MaskedPart::kPruned, rd, {});
    return result;
  }

  RefineStats refine_dsnot(const Tensor& weight, const std::vector<double>& mu,
                           const std::vector<double>& var, const std::vector<double>& act_norm, Mask& mask,
                           const DsnotOptions& options, std::optional<NmPattern> nm,
                           const std::vector<double>* column_l1) override {
    const OpTimer timer("refine_dsnot");
    Tensor widened;
    return refine_dsnot_on_device(fp32_view(weight, widened), mu, var, act_norm, mask, options, nm,
                                  column_l1);
  }

  std::vector<double> initial_column_l1(const Tensor& weight, const Mask& mask) override {
    const OpTimer timer("initial_column_l1");
    Tensor widened;
    return initial_column_l1_on_device(fp32_view(weight, widened), mask);
  }

  std::vector<double> row_nll(const Tensor& logits, std::span<const int32_t> targets) override {
    const OpTimer timer("row_nll");
    const int64_t vocab = cols_of(logits), rows = rows_of(logits);
    SYMPRUNE_ASSERT(static_cast<int64_t>(targets.size()) == rows, "row_nll: {} targets for logits {}",
                    targets.size(), logits.shape_string());
    std::vector<double> nll(static_cast<size_t>(rows));
    if (rows == 0) return nll;
    const DeviceArray<int32_t> device_targets(targets.data(), rows);
    DeviceArray<double> device_nll(rows);
    launch_row_nll(in(logits, "logits"), device_targets.data(), rows, vocab, device_nll.data(), {});
    copy_to_host(nll.data(), device_nll.data(), nll.size() * sizeof(double));
    return nll;
  }

  std::optional<DeviceMemory> device_memory() override {
    DeviceMemory memory;
    device_memory_info(&memory.free, &memory.total);
    const DevicePoolMemory pool = device_pool_memory();
    memory.held = pool.reserved;
    memory.peak_used = pool.peak_used;
    memory.peak_reserved = pool.peak_reserved;
    memory.pooled = !plain_device_allocations();
    return memory;
  }
  void reset_device_memory_peak() override { cuda::reset_device_memory_peak(); }

 private:
  std::vector<float> rope_inv_freq_;
  int64_t rope_seq_len_ = -1;
  DeviceArray<float> rope_cos_, rope_sin_;
  AttentionScratch attention_scratch_;
  WeightUploader uploader_;
};

}  // namespace

void set_cuda_backend_device(int device) {
  backend_device.store(device);
}

Backend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

}  // namespace symprune::cuda
