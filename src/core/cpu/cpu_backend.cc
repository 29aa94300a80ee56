// The reference CPU backend: OpenBLAS sgemm for every matrix product (linears and the two attention
// products), OpenMP over rows / (sequence, head, query block) for the rest. Reductions of norms use
// double accumulation so results do not depend on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/system_memory.h"

namespace symprune {
namespace {

int64_t cols_of(const Tensor& t) {
  return t.rank() == 0 ? 1 : t.dim(-1);
}
int64_t rows_of(const Tensor& t) {
  const int64_t c = cols_of(t);
  return c == 0 ? 0 : t.numel() / c;
}

// OpenBLAS's own thread pool must not run inside our OpenMP regions (oversubscription, and the
// pthread build serialises concurrent callers); this pins it to one thread for a scope.
// Under `ulimit -v`, OpenBLAS maps a 128 MiB buffer for each thread at its first product and, when the
// mapping fails, retries forever at full CPU: even a first SIGTERM cannot stop it. prune checks the limit
// with its memory plan; every other command (eval, logits) gets the check here, before the first product,
// with prune's allowance: kBlasThreadAddressSpace per thread (buffer and heap arena) and 64 MiB more.
// Measured with eval on stories260K and 2 threads, a limit that leaves about 280 MiB here still hung in one
// try of two: the buffers alone (256 MiB) are not enough.
void check_blas_buffers_fit() {
  static std::atomic<bool> checked{false};
  if (checked.load(std::memory_order_acquire)) return;
  if (const auto left = address_space_left_bytes()) {
    const int threads = cpu_threads();
    const double needed = blas_address_space_bytes(threads);
    SYMPRUNE_CHECK(
        needed <= static_cast<double>(*left),
        "the address-space limit (ulimit -v) leaves {} to this run, but the BLAS library's buffers and "
        "the threads' heaps take about {} ({} MiB for each of its {} threads, and 64 MiB): raise or "
        "remove ulimit -v (it limits mappings, not memory in use), or give fewer --threads",
        format_bytes(static_cast<double>(*left)), format_bytes(needed),
        static_cast<int>(kBlasThreadAddressSpace / (1 << 20)), threads);
  }
  checked.store(true, std::memory_order_release);
}

class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
    check_blas_buffers_fit();
    openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() { openblas_set_num_threads(saved_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

// Below this many elements an op runs on one thread: a parallel region costs more than it saves, and
// on a busy machine each barrier can wait a whole scheduler time slice.
constexpr int64_t kParallelMinElements = 1 << 15;
constexpr int64_t kLinearRowBlock = 256;  // rows per single-threaded sgemm in linear()

// Query rows per attention work item: bounds the per-thread score buffer to kQueryBlock × T.
constexpr int64_t kQueryBlock = 128;

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) override {
    const int64_t width = copy_rows_width(src, src_row, dst, dst_row, rows);
    if (rows > 0)
      std::memcpy(dst.data() + dst_row * width, src.data() + src_row * width,
                  static_cast<size_t>(rows * width) * sizeof(float));
  }

  void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) override {
    SYMPRUNE_ASSERT(weight.rank() == 2, "linear weight must be 2-D, got {}", weight.shape_string());
    const int64_t m = weight.dim(0), n = weight.dim(1);
    SYMPRUNE_ASSERT(cols_of(x) == n, "linear: input {} vs weight {}", x.shape_string(),
                    weight.shape_string());
    const int64_t rows = rows_of(x);
    std::vector<int64_t> shape = x.shape();
    shape.back() = m;
    y.resize(std::move(shape));
    if (rows == 0 || m == 0) return;
    const bool has_bias = bias != nullptr && !bias->empty();
    if (has_bias)
      SYMPRUNE_ASSERT(bias->numel() == m, "linear bias {} vs {} outputs", bias->shape_string(), m);
    // Blocks of kLinearRowBlock rows, each one single-threaded sgemm: a multi-threaded OpenBLAS sgemm is not
    // thread-count independent (with one thread OpenBLAS 0.3.21 takes its "direct" small-matrix kernel on
    // Zen/SkylakeX, whose sums run in another order), and results must not depend on --threads. The split
    // depends on `rows` only, which the pipeline fixes per forward pass.
    const int64_t row_blocks = (rows + kLinearRowBlock - 1) / kLinearRowBlock;
    {
      SingleThreadedBlas single;
#pragma omp parallel for schedule(static) if (row_blocks > 1 && rows * m * n >= kParallelMinElements * 64)
      for (int64_t blk = 0; blk < row_blocks; ++blk) {
        const int64_t r0 = blk * kLinearRowBlock;
        const int64_t nr = std::min(kLinearRowBlock, rows - r0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(nr),
                    static_cast<blasint>(m), static_cast<blasint>(n), 1.0f, x.data() + r0 * n,
                    static_cast<blasint>(n), weight.data(), static_cast<blasint>(n), 0.0f, y.data() + r0 * m,
                    static_cast<blasint>(m));
      }
    }
    if (has_bias) {
      const float* b = bias->data();
      float* out = y.data();
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMinElements)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = out + r * m;
        for (int64_t j = 0; j < m; ++j) row[j] += b[j];
      }
    }
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                DType /*read_as: fp32 is written regardless*/) override {
    const int64_t d = cols_of(x), rows = rows_of(x);
    SYMPRUNE_ASSERT(weight.numel() == d, "rms_norm weight {} vs width {}", weight.shape_string(), d);
    y.resize(x.shape());
    const float* in = x.data();
    const float* w = weight.data();
    float* out = y.data();
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = in + r * d;
      float* yr = out + r * d;
      double sumsq = 0.0;
      for (int64_t j = 0; j < d; ++j) sumsq += static_cast<double>(xr[j]) * xr[j];
      const float inv = static_cast<float>(1.0 / std::sqrt(sumsq / static_cast<double>(d) + eps));
      for (int64_t j = 0; j < d; ++j) yr[j] = w[j] * (xr[j] * inv);
    }
  }

  void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps, Tensor& y) override {
    const int64_t d = cols_of(x), rows = rows_of(x);
    const float* w = weight != nullptr && !weight->empty() ? weight->data() : nullptr;
    const float* b = bias != nullptr && !bias->empty() ? bias->data() : nullptr;
    if (w)
      SYMPRUNE_ASSERT(weight->numel() == d, "layer_norm weight {} vs width {}", weight->shape_string(), d);
    if (b) SYMPRUNE_ASSERT(bias->numel() == d, "layer_norm bias {} vs width {}", bias->shape_string(), d);
    y.resize(x.shape());
    const float* in = x.data();
    float* out = y.data();
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = in + r * d;
      float* yr = out + r * d;
      double sum = 0.0;
      for (int64_t j = 0; j < d; ++j) sum += xr[j];
      const double mean = sum / static_cast<double>(d);
      double var = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        const double c = xr[j] - mean;
        var += c * c;
      }
      var /= static_cast<double>(d);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t j = 0; j < d; ++j) {
        float v = static_cast<float>((xr[j] - mean) * inv);
        if (w) v *= w[j];
        if (b) v += b[j];
        yr[j] = v;
      }
    }
  }

  void rope(Tensor& x, const SequenceBatch& batch, int64_t n_heads, std::span<const float> inv_freq,
            DType /*read_as: fp32 is written regardless*/) override {
    const int64_t half = static_cast<int64_t>(inv_freq.size());
    const int64_t hd = 2 * half;
    SYMPRUNE_ASSERT(cols_of(x) == n_heads * hd, "rope: width {} vs {} heads x {}", cols_of(x), n_heads, hd);
    SYMPRUNE_ASSERT(rows_of(x) == batch.rows(), "rope: {} rows vs batch {}x{}", rows_of(x), batch.n_seqs,
                    batch.seq_len);
    const RopeTables tables = rope_tables(inv_freq, batch.seq_len);
    const std::vector<float>& cos_table = tables.cos;
    const std::vector<float>& sin_table = tables.sin;
    float* data = x.data();
    const int64_t rows = batch.rows(), width = n_heads * hd;
#pragma omp parallel for schedule(static) if (rows * width >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % batch.seq_len;
      const float* c = cos_table.data() + t * half;
      const float* s = sin_table.data() + t * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = data + r * width + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c[i] - x2 * s[i];
          v[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const SequenceBatch& batch,
                 int64_t n_heads, int64_t n_kv_heads, float scale, Tensor& out, DType operands,
                 DType /*read_as: fp32 is written regardless*/) override {
    SYMPRUNE_ASSERT(operands == DType::kF32, "cpu attention in {}: this backend computes in fp32 only",
                    dtype_name(operands));
    SYMPRUNE_ASSERT(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0, "heads {} / kv heads {}",
                    n_heads, n_kv_heads);
    const int64_t q_width = cols_of(q), kv_width = cols_of(k);
    const int64_t hd = q_width / n_heads;
    SYMPRUNE_ASSERT(hd * n_heads == q_width && hd * n_kv_heads == kv_width && cols_of(v) == kv_width,
                    "attention widths q {} k {} v {} for {}/{} heads", q.shape_string(), k.shape_string(),
                    v.shape_string(), n_heads, n_kv_heads);
    const int64_t T = batch.seq_len;
    SYMPRUNE_ASSERT(rows_of(q) == batch.rows() && rows_of(k) == batch.rows() && rows_of(v) == batch.rows(),
                    "attention rows vs batch {}x{}", batch.n_seqs, T);
    out.resize(q.shape());
    if (batch.rows() == 0) return;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t n_blocks = (T + kQueryBlock - 1) / kQueryBlock;
    const int64_t items = batch.n_seqs * n_heads * n_blocks;
    const float* qd = q.data();
    const float* kd = k.data();
    const float* vd = v.data();
    float* od = out.data();
    SingleThreadedBlas single;
    const int64_t work = batch.n_seqs * n_heads * T * T * hd / 2;
#pragma omp parallel if (work >= kParallelMinElements * 8)
    {
      std::vector<float> scores(static_cast<size_t>(kQueryBlock * T));
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) {
        // Later query blocks cost more; handing them out first balances the dynamic schedule.
        const int64_t blk = n_blocks - 1 - item % n_blocks;
        const int64_t h = (item / n_blocks) % n_heads;
        const int64_t s = item / (n_blocks * n_heads);
        const int64_t kvh = h / group;
        const int64_t i0 = blk * kQueryBlock;
        const int64_t i1 = std::min(T, i0 + kQueryBlock);
        const int64_t nq = i1 - i0, nk = i1;  // causal: keys 0 .. i1-1 suffice
        const float* qp = qd + (s * T + i0) * q_width + h * hd;
        const float* kp = kd + (s * T) * kv_width + kvh * hd;
        const float* vp = vd + (s * T) * kv_width + kvh * hd;
        float* op = od + (s * T + i0) * q_width + h * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(nq),
                    static_cast<blasint>(nk), static_cast<blasint>(hd), scale, qp,
                    static_cast<blasint>(q_width), kp, static_cast<blasint>(kv_width), 0.0f, scores.data(),
                    static_cast<blasint>(nk));
        for (int64_t ii = 0; ii < nq; ++ii) {
          float* row = scores.data() + ii * nk;
          const int64_t last = i0 + ii;  // keys 0..last are visible
          float mx = row[0];
          for (int64_t j = 1; j <= last; ++j) mx = std::max(mx, row[j]);
          double sum = 0.0;
          for (int64_t j = 0; j <= last; ++j) {
            const float e = std::exp(row[j] - mx);
            row[j] = e;
            sum += e;
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
          for (int64_t j = last + 1; j < nk; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(nq),
                    static_cast<blasint>(hd), static_cast<blasint>(nk), 1.0f, scores.data(),
                    static_cast<blasint>(nk), vp, static_cast<blasint>(kv_width), 0.0f, op,
                    static_cast<blasint>(q_width));
      }
    }
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out,
                DType /*read_as: fp32 is written regardless*/) override {
    SYMPRUNE_ASSERT(gate.numel() == up.numel(), "silu_mul {} vs {}", gate.shape_string(), up.shape_string());
    out.resize(gate.shape());
    const float* g = gate.data();
    const float* u = up.data();
    float* o = out.data();
    const int64_t n = gate.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) {
      const float x = g[i];
      o[i] = x / (1.0f + std::exp(-x)) * u[i];
    }
  }

  void relu(Tensor& x) override {
    float* d = x.data();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) d[i] = d[i] > 0.0f ? d[i] : 0.0f;
  }

  void add(Tensor& x, const Tensor& y) override {
    SYMPRUNE_ASSERT(x.numel() == y.numel(), "add {} vs {}", x.shape_string(), y.shape_string());
    float* a = x.data();
    const float* b = y.data();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  }

  void add_into_rows(const Tensor& x, const Tensor& y, Tensor& dst, int64_t dst_row) override {
    SYMPRUNE_ASSERT(x.numel() == y.numel() && !dst.on_device(), "add_into_rows {} vs {} into {}",
                    x.shape_string(), y.shape_string(), dst.shape_string());
    const int64_t width = copy_rows_width(x, 0, dst, dst_row, rows_of(x)), n = x.numel();
    const float* a = x.data();
    const float* b = y.data();
    float* out = dst.data() + dst_row * width;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out) override {
    SYMPRUNE_ASSERT(table.rank() == 2, "embedding table {}", table.shape_string());
    const int64_t d = table.dim(1), vocab = table.dim(0);
    const int64_t n = static_cast<int64_t>(ids.size());
    out.resize({n, d});
    const float* src = table.data();
    float* dst = out.data();
#pragma omp parallel for schedule(static) if (n * d >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[static_cast<size_t>(i)];
      SYMPRUNE_ASSERT(id >= 0 && id < vocab, "token id {} outside [0, {})", id, vocab);
      std::memcpy(dst + i * d, src + id * d, static_cast<size_t>(d) * sizeof(float));
    }
  }

  void add_position_rows(Tensor& x, const Tensor& table, const SequenceBatch& batch,
                         int64_t row_offset) override {
    const int64_t d = cols_of(x);
    SYMPRUNE_ASSERT(table.rank() == 2 && table.dim(1) == d, "position table {} vs width {}",
                    table.shape_string(), d);
    SYMPRUNE_ASSERT(row_offset + batch.seq_len <= table.dim(0), "positions up to {} vs table {}",
                    row_offset + batch.seq_len, table.shape_string());
    SYMPRUNE_ASSERT(rows_of(x) == batch.rows(), "add_position_rows rows vs batch");
    float* xd = x.data();
    const float* td = table.data();
    const int64_t rows = batch.rows();
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = td + (row_offset + r % batch.seq_len) * d;
      float* xr = xd + r * d;
      for (int64_t j = 0; j < d; ++j) xr[j] += p[j];
    }
  }
};

}  // namespace

int64_t copy_rows_width(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                        int64_t rows) {
  const int64_t width = cols_of(src);
  SYMPRUNE_ASSERT(cols_of(dst) == width && src_row >= 0 && dst_row >= 0 && rows >= 0 &&
                      (src_row + rows) * width <= src.numel() && (dst_row + rows) * width <= dst.numel(),
                  "copy_rows {} rows {}+{} -> {} row {}", src.shape_string(), src_row, rows,
                  dst.shape_string(), dst_row);
  return width;
}

RopeTables rope_tables(std::span<const float> inv_freq, int64_t seq_len) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  RopeTables tables;
  tables.cos.resize(static_cast<size_t>(seq_len * half));
  tables.sin.resize(tables.cos.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Angles as transformers forms them: fp32 inv_freq times fp32 position, in fp32.
      const float angle = inv_freq[static_cast<size_t>(i)] * static_cast<float>(t);
      tables.cos[static_cast<size_t>(t * half + i)] =
          static_cast<float>(std::cos(static_cast<double>(angle)));
      tables.sin[static_cast<size_t>(t * half + i)] =
          static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return tables;
}

std::vector<float> rope_inv_freq(int64_t head_dim, double theta,
                                 const std::optional<Llama3RopeScaling>& scaling) {
  SYMPRUNE_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim, got {}", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
    inv[static_cast<size_t>(i)] = 1.0f / power;
  }
  if (scaling) {
    const double factor = scaling->factor, low = scaling->low_freq_factor, high = scaling->high_freq_factor;
    const double old_len = scaling->original_max_position_embeddings;
    const double low_freq_wavelen = old_len / low;
    const double high_freq_wavelen = old_len / high;
    const double kPi = 3.14159265358979323846;
    for (float& f : inv) {
      const double freq = f;
      const double wavelen = 2.0 * kPi / freq;
      double scaled;
      if (wavelen < high_freq_wavelen) {
        scaled = freq;
      } else if (wavelen > low_freq_wavelen) {
        scaled = freq / factor;
      } else {
        const double smooth = (old_len / wavelen - low) / (high - low);
        scaled = (1.0 - smooth) * freq / factor + smooth * freq;
      }
      f = static_cast<float>(scaled);
    }
  }
  return inv;
}

int max_cpu_threads() {
  // Oversubscribing a few times can make sense (hyperthreads, waiting on I/O); beyond that only slows down,
  // and tens of thousands of threads exhaust memory for their stacks.
  return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void set_cpu_threads(int n) {
  SYMPRUNE_CHECK(n >= 0 && n <= max_cpu_threads(),
                 "--threads {}: use 0 (automatic: one per CPU) or 1..{} (4 x the {} CPUs of this machine)", n,
                 max_cpu_threads(), max_cpu_threads() / 4);
  if (n == 0) return;
  // Each BLAS thread started maps its 128 MiB buffer at once, and under `ulimit -v` a failing mapping is
  // retried forever at full CPU (the process cannot even exit): checked before the threads start.
  const int started = openblas_get_num_threads();
  if (const auto left = address_space_left_bytes(); left && n > started) {
    const double needed = static_cast<double>(n - started) * kBlasThreadAddressSpace;
    SYMPRUNE_CHECK(
        needed <= static_cast<double>(*left),
        "--threads {}: the address-space limit (ulimit -v) leaves {} to this run, but starting {} more "
        "BLAS threads maps about {} (128 MiB of buffer and 64 MiB of heap for each): raise or remove "
        "ulimit -v (it limits mappings, not memory in use), or give fewer --threads",
        n, format_bytes(static_cast<double>(*left)), n - started, format_bytes(needed));
  }
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int cpu_threads() {
  return omp_get_max_threads();
}

void set_cpu_threads_of_this_thread(int n) {
  if (n > 0) omp_set_num_threads(n);
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace symprune
