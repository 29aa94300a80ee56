// Forward-pass kernels (see forward_kernels.h). Products and sums that nvcc could contract into FMAs are
// written with __fmul_rn/__fadd_rn where the CPU result is reproduced bit for bit.
#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda {
namespace {

using namespace kernels;

// Σ over the block (fp64); every thread gets the result. All threads must call it.
__device__ double block_sum(double value) {
  __shared__ double warp_sums[kWarps];
  __shared__ double total;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(kFullMask, value, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[w];
    total = sum;
  }
  __syncthreads();
  const double result = total;
  __syncthreads();  // warp_sums / total are reused by the next call
  return result;
}

// Whether every pointer is 16-byte aligned (the vector kernels' float4 accesses); null pointers pass.
template <typename... Pointers>
bool aligned16(Pointers... pointers) {
  return (aligned_to(pointers, 16) && ...);
}

// The elementwise kernels below take four elements per thread and step when their pointers allow
// (`vector`: count/4 float4 accesses, then the last count % 4 one by one), each element computed exactly as
// in the one-at-a-time loop: the vector accesses only move more bytes per instruction.

// The 16-bit copy of an output element (RoundedOutput): `rounded` null writes none.
__device__ __forceinline__ uint16_t round_16bit(bool bf16, float value) {
  return bf16 ? float_to_bf16_bits(value) : float_to_fp16_bits(value);
}
__device__ __forceinline__ void write_rounded(uint16_t* rounded, bool bf16, int64_t i, float value) {
  if (rounded != nullptr) rounded[i] = round_16bit(bf16, value);
}
__device__ __forceinline__ void write_rounded4(uint16_t* rounded, bool bf16, int64_t i, float4 value) {
  if (rounded != nullptr)
    store_4x16(rounded + i, round_16bit(bf16, value.x), round_16bit(bf16, value.y),
               round_16bit(bf16, value.z), round_16bit(bf16, value.w));
}

// What the norm kernels take as x: x itself; x + residual (fp32); or a 16-bit source widened. In the last
// three the kernel stores x's new values in its first loop and reads them back in its second, each thread the
// elements it stored (the same partition in both loops).
enum class NormInput { kX, kResidual, kWidenedBf16, kWidenedFp16 };

template <NormInput kInput>
__device__ __forceinline__ float norm_input(float* xr, const void* source, int64_t row_first, int64_t j) {
  if constexpr (kInput == NormInput::kX) {
    return xr[j];
  } else {
    float v;
    if constexpr (kInput == NormInput::kResidual)
      v = __fadd_rn(xr[j], static_cast<const float*>(source)[row_first + j]);
    else if constexpr (kInput == NormInput::kWidenedBf16)
      v = bf16_bits_to_float(static_cast<const uint16_t*>(source)[row_first + j]);
    else
      v = fp16_bits_to_float(static_cast<const uint16_t*>(source)[row_first + j]);
    xr[j] = v;
    return v;
  }
}
template <NormInput kInput>
__device__ __forceinline__ float4 norm_input4(float* xr, const void* source, int64_t row_first, int64_t i) {
  if constexpr (kInput == NormInput::kX) {
    return load_float4(xr + i);
  } else {
    float4 v;
    if constexpr (kInput == NormInput::kResidual) {
      const float4 a = load_float4(xr + i),
                   b = load_float4(static_cast<const float*>(source) + row_first + i);
      v = float4{__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w)};
    } else {
      uint16_t bits[4];
      load_4x16(static_cast<const uint16_t*>(source) + row_first + i, bits);
      constexpr bool kBf16 = kInput == NormInput::kWidenedBf16;
      v = kBf16 ? float4{bf16_bits_to_float(bits[0]), bf16_bits_to_float(bits[1]),
                         bf16_bits_to_float(bits[2]), bf16_bits_to_float(bits[3])}
                : float4{fp16_bits_to_float(bits[0]), fp16_bits_to_float(bits[1]),
                         fp16_bits_to_float(bits[2]), fp16_bits_to_float(bits[3])};
    }
    store_float4(xr + i, v);
    return v;
  }
}

template <NormInput kInput>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(float* x, const void* __restrict__ source, const float* __restrict__ weight, int64_t d,
                    float eps, float* __restrict__ y, uint16_t* __restrict__ rounded, bool rounded_bf16) {
  const int64_t row_first = static_cast<int64_t>(blockIdx.x) * d;
  float* xr = x + row_first;
  float* yr = y != nullptr ? y + row_first : nullptr;
  double sumsq = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float v = norm_input<kInput>(xr, source, row_first, j);
    sumsq += static_cast<double>(v) * v;
  }
  sumsq = block_sum(sumsq);
  const float inv = static_cast<float>(1.0 / sqrt(sumsq / static_cast<double>(d) + eps));
  uint16_t* rr = rounded != nullptr ? rounded + row_first : nullptr;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float value = __fmul_rn(weight[j], __fmul_rn(xr[j], inv));
    if (yr != nullptr) yr[j] = value;
    write_rounded(rr, rounded_bf16, j, value);
  }
}

// The same with float4 accesses (d % 4 == 0, 16-byte aligned rows): thread j sums the groups of four j,
// j + kThreads, ... (another order of the fp64 partial sums than rms_norm_kernel's, within the same tolerance
// of the CPU); each output is computed as there.
template <NormInput kInput>
__global__ void __launch_bounds__(kThreads)
    rms_norm4_kernel(float* x, const void* __restrict__ source, const float* __restrict__ weight, int64_t d,
                     float eps, float* __restrict__ y, uint16_t* __restrict__ rounded, bool rounded_bf16) {
  const int64_t row_first = static_cast<int64_t>(blockIdx.x) * d, quads = d / 4;
  float* xr = x + row_first;
  float* yr = y != nullptr ? y + row_first : nullptr;
  double sumsq = 0.0;
  for (int64_t q = threadIdx.x; q < quads; q += kThreads) {
    const float4 v = norm_input4<kInput>(xr, source, row_first, 4 * q);
    sumsq += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
             static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
  }
  sumsq = block_sum(sumsq);
  const float inv = static_cast<float>(1.0 / sqrt(sumsq / static_cast<double>(d) + eps));
  uint16_t* rr = rounded != nullptr ? rounded + row_first : nullptr;
  for (int64_t q = threadIdx.x; q < quads; q += kThreads) {
    const float4 v = load_float4(xr + 4 * q), w = load_float4(weight + 4 * q);
    const float4 out{__fmul_rn(w.x, __fmul_rn(v.x, inv)), __fmul_rn(w.y, __fmul_rn(v.y, inv)),
                     __fmul_rn(w.z, __fmul_rn(v.z, inv)), __fmul_rn(w.w, __fmul_rn(v.w, inv))};
    if (yr != nullptr) store_float4(yr + 4 * q, out);
    write_rounded4(rr, rounded_bf16, 4 * q, out);
  }
}

__global__ void __launch_bounds__(kThreads)
    layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                      const float* __restrict__ bias, int64_t d, float eps, float* __restrict__ y) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * d;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * d;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) sum += xr[j];
  const double mean = block_sum(sum) / static_cast<double>(d);
  double var = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const double c = xr[j] - mean;
    var += c * c;
  }
  var = block_sum(var) / static_cast<double>(d);
  const double inv = 1.0 / sqrt(var + eps);
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    float v = static_cast<float>((xr[j] - mean) * inv);
    if (weight != nullptr) v = __fmul_rn(v, weight[j]);
    if (bias != nullptr) v = __fadd_rn(v, bias[j]);
    yr[j] = v;
  }
}

__device__ __forceinline__ float rotated_first(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rotated_second(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Four frequencies of one head and row per thread (half % 4 == 0, aligned pointers): float4 accesses.
__global__ void rope4_kernel(float* __restrict__ x, int64_t rows, int64_t seq_len, int64_t n_heads,
                             int64_t half, const float* __restrict__ cos_table,
                             const float* __restrict__ sin_table, uint16_t* __restrict__ rounded,
                             bool rounded_bf16, bool write_fp32) {
  const int64_t quarter = half / 4;
  SYMPRUNE_GRID_STRIDE(i, rows * n_heads * quarter) {
    const int64_t f = 4 * (i % quarter), head_row = i / quarter;
    const int64_t t = head_row / n_heads % seq_len;
    const int64_t first = head_row * 2 * half + f;  // row head_row / n_heads, head head_row % n_heads
    const float4 x1 = load_float4(x + first), x2 = load_float4(x + first + half);
    const float4 c = load_float4(cos_table + t * half + f), s = load_float4(sin_table + t * half + f);
    const float4 y1{rotated_first(x1.x, x2.x, c.x, s.x), rotated_first(x1.y, x2.y, c.y, s.y),
                    rotated_first(x1.z, x2.z, c.z, s.z), rotated_first(x1.w, x2.w, c.w, s.w)};
    const float4 y2{rotated_second(x1.x, x2.x, c.x, s.x), rotated_second(x1.y, x2.y, c.y, s.y),
                    rotated_second(x1.z, x2.z, c.z, s.z), rotated_second(x1.w, x2.w, c.w, s.w)};
    if (write_fp32) {
      store_float4(x + first, y1);
      store_float4(x + first + half, y2);
    }
    write_rounded4(rounded, rounded_bf16, first, y1);
    write_rounded4(rounded, rounded_bf16, first + half, y2);
  }
}

__global__ void rope_kernel(float* __restrict__ x, int64_t rows, int64_t seq_len, int64_t n_heads,
                            int64_t half, const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, uint16_t* __restrict__ rounded,
                            bool rounded_bf16, bool write_fp32) {
  const int64_t pairs = rows * n_heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t f = i % half, h = (i / half) % n_heads, r = i / (half * n_heads);
    const int64_t t = r % seq_len;
    const int64_t first = r * n_heads * 2 * half + h * 2 * half + f;
    float* v = x + first;
    const float c = cos_table[t * half + f], s = sin_table[t * half + f];
    const float x1 = v[0], x2 = v[half];
    const float y1 = rotated_first(x1, x2, c, s), y2 = rotated_second(x1, x2, c, s);
    if (write_fp32) {
      v[0] = y1;
      v[half] = y2;
    }
    write_rounded(rounded, rounded_bf16, first, y1);
    write_rounded(rounded, rounded_bf16, first + half, y2);
  }
}

__device__ __forceinline__ float silu_times(float g, float u) {
  return __fmul_rn(g / __fadd_rn(1.0f, expf(-g)), u);
}

__global__ void silu_mul_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t count,
                                float* __restrict__ out, uint16_t* __restrict__ rounded, bool rounded_bf16,
                                bool vector) {
  const int64_t head = vector ? count / 4 : 0;
  SYMPRUNE_GRID_STRIDE(q, head) {
    const float4 g = load_float4(gate + 4 * q), u = load_float4(up + 4 * q);
    const float4 value{silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z),
                       silu_times(g.w, u.w)};
    if (out != nullptr) store_float4(out + 4 * q, value);
    write_rounded4(rounded, rounded_bf16, 4 * q, value);
  }
  SYMPRUNE_GRID_STRIDE(j, count - 4 * head) {
    const int64_t i = 4 * head + j;
    const float value = silu_times(gate[i], up[i]);
    if (out != nullptr) out[i] = value;
    write_rounded(rounded, rounded_bf16, i, value);
  }
}

__global__ void relu_kernel(float* __restrict__ x, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// out = x + y; out may be x.
__global__ void add_kernel(const float* x, const float* __restrict__ y, int64_t count, float* out,
                           bool vector) {
  const int64_t head = vector ? count / 4 : 0;
  SYMPRUNE_GRID_STRIDE(q, head) {
    const float4 a = load_float4(x + 4 * q), b = load_float4(y + 4 * q);
    store_float4(out + 4 * q,
                 float4{__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w)});
  }
  SYMPRUNE_GRID_STRIDE(j, count - 4 * head) {
    const int64_t i = 4 * head + j;
    out[i] = __fadd_rn(x[i], y[i]);
  }
}

// out = x + y rounded to 16 bits (the conversion's rounding, convert_kernels.cu).
__global__ void add_round_kernel(const float* __restrict__ x, const float* __restrict__ y, int64_t count,
                                 uint16_t* __restrict__ out, bool bf16, bool vector) {
  const int64_t head = vector ? count / 4 : 0;
  SYMPRUNE_GRID_STRIDE(q, head) {
    const float4 a = load_float4(x + 4 * q), b = load_float4(y + 4 * q);
    store_4x16(out + 4 * q, round_16bit(bf16, __fadd_rn(a.x, b.x)), round_16bit(bf16, __fadd_rn(a.y, b.y)),
               round_16bit(bf16, __fadd_rn(a.z, b.z)), round_16bit(bf16, __fadd_rn(a.w, b.w)));
  }
  SYMPRUNE_GRID_STRIDE(j, count - 4 * head) {
    const int64_t i = 4 * head + j;
    out[i] = round_16bit(bf16, __fadd_rn(x[i], y[i]));
  }
}

__global__ void embedding_kernel(const float* __restrict__ table, const int32_t* __restrict__ ids,
                                 int64_t count, int64_t d, float* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count * d;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = table[static_cast<int64_t>(ids[i / d]) * d + i % d];
}

__global__ void add_position_rows_kernel(float* __restrict__ x, const float* __restrict__ table, int64_t rows,
                                         int64_t seq_len, int64_t row_offset, int64_t d) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * d;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / d;
    x[i] = __fadd_rn(x[i], table[(row_offset + r % seq_len) * d + i % d]);
  }
}

constexpr int kMaxHeadDim = 256;
constexpr int kMaxPerLane = kMaxHeadDim / 32;

// One warp per query row, kWarps queries per block; keys and values of a tile of kv rows are staged
// in shared memory for all of the block's queries. Online softmax in fp32 (running max, running sum).
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                     int64_t seq_len, int64_t n_heads, int64_t group, int64_t hd, int tile_keys, float scale,
                     float* __restrict__ out) {
  SYMPRUNE_DYNAMIC_SHARED(float, staged);  // [tile_keys][hd] keys, then [tile_keys][hd] values
  float* k_tile = staged;
  float* v_tile = staged + static_cast<int64_t>(tile_keys) * hd;
  const int64_t s = blockIdx.z, h = blockIdx.y, kvh = h / group;
  const int64_t q_width = n_heads * hd, kv_width = (n_heads / group) * hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t first_query = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t t = first_query + warp;  // this warp's query position
  const bool active = t < seq_len;
  const int per_lane = static_cast<int>((hd + 31) / 32);

  float q_reg[kMaxPerLane], acc[kMaxPerLane];
  // Unrolled over the constant kMaxPerLane so q_reg and acc stay in registers (a loop to the run-time
  // per_lane indexes them dynamically, which puts them in local memory: ptxas showed a 64-byte stack).
  SYMPRUNE_UNROLL
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    q_reg[i] = active && i < per_lane && j < hd ? q[(s * seq_len + t) * q_width + h * hd + j] : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -INFINITY, running_sum = 0.0f;
  const int64_t last_key = (first_query + kWarps - 1 < seq_len ? first_query + kWarps - 1 : seq_len - 1);
  for (int64_t k0 = 0; k0 <= last_key; k0 += tile_keys) {
    const int64_t tile = (last_key + 1 - k0) < tile_keys ? (last_key + 1 - k0) : tile_keys;
    for (int64_t e = threadIdx.x; e < tile * hd; e += kThreads) {
      const int64_t key = k0 + e / hd, j = e % hd;
      k_tile[e] = k[(s * seq_len + key) * kv_width + kvh * hd + j];
      v_tile[e] = v[(s * seq_len + key) * kv_width + kvh * hd + j];
    }
    __syncthreads();
    if (active) {
      const int64_t visible = (t - k0 + 1) < tile ? (t - k0 + 1) : tile;  // causal: keys ≤ t
      for (int64_t key = 0; key < visible; ++key) {
        float dot = 0.0f;
        SYMPRUNE_UNROLL
        for (int i = 0; i < kMaxPerLane; ++i) {
          const int64_t j = lane + 32 * i;
          if (i < per_lane && j < hd) dot += q_reg[i] * k_tile[key * hd + j];
        }
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(kFullMask, dot, offset);
        const float score = dot * scale;
        const float new_max = score > running_max ? score : running_max;
        const float correction = expf(running_max - new_max);
        const float p = expf(score - new_max);
        running_sum = running_sum * correction + p;
        SYMPRUNE_UNROLL
        for (int i = 0; i < kMaxPerLane; ++i) {
          const int64_t j = lane + 32 * i;
          if (i < per_lane) acc[i] = acc[i] * correction + (j < hd ? p * v_tile[key * hd + j] : 0.0f);
        }
        running_max = new_max;
      }
    }
    __syncthreads();  // the next tile overwrites the staged rows
  }
  if (active) {
    const float inv = 1.0f / running_sum;
    SYMPRUNE_UNROLL
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (i < per_lane && j < hd) out[(s * seq_len + t) * q_width + h * hd + j] = acc[i] * inv;
    }
  }
}

// The kernels' path (and so the order of a row's sums) is chosen by x, weight and the outputs alone, as for
// rms_norm; a `source` that this path could not read is the caller's to handle (it runs the ops unfused).
bool norm_vector_path(const float* x, const float* weight, int64_t d, const float* y,
                      const RoundedOutput& rounded) {
  return d % 4 == 0 && aligned16(x, weight, y) && aligned_to(rounded.data, 8);
}
template <NormInput kInput>
void launch_rms_norm_of(float* x, const void* source, const float* weight, int64_t rows, int64_t d, float eps,
                        float* y, DeviceStream stream, RoundedOutput rounded) {
  if (rows <= 0 || d <= 0) return;
  auto* rounded_data = static_cast<uint16_t*>(rounded.data);
  if (norm_vector_path(x, weight, d, y, rounded))
    SYMPRUNE_LAUNCH(rms_norm4_kernel<kInput>, static_cast<unsigned>(rows), kThreads, 0, native(stream), x,
                    source, weight, d, eps, y, rounded_data, rounded.dtype == DType::kBF16);
  else
    SYMPRUNE_LAUNCH(rms_norm_kernel<kInput>, static_cast<unsigned>(rows), kThreads, 0, native(stream), x,
                    source, weight, d, eps, y, rounded_data, rounded.dtype == DType::kBF16);
  SYMPRUNE_CHECK_LAUNCH();
}
}  // namespace

void launch_rms_norm(const float* x, const float* weight, int64_t rows, int64_t d, float eps, float* y,
                     DeviceStream stream, RoundedOutput rounded) {
  // With NormInput::kX the kernel only reads x.
  launch_rms_norm_of<NormInput::kX>(const_cast<float*>(x), nullptr, weight, rows, d, eps, y, stream, rounded);
}

void launch_add_rms_norm(float* x, const float* residual, const float* weight, int64_t rows, int64_t d,
                         float eps, float* y, DeviceStream stream, RoundedOutput rounded) {
  // The vector path reads the residual four at a time: one that would not allow it is added apart (the
  // same sums in the same order as rms_norm's path).
  if (norm_vector_path(x, weight, d, y, rounded) && !aligned16(residual)) {
    launch_add(x, residual, rows * d, stream);
    launch_rms_norm(x, weight, rows, d, eps, y, stream, rounded);
    return;
  }
  launch_rms_norm_of<NormInput::kResidual>(x, residual, weight, rows, d, eps, y, stream, rounded);
}

void launch_widen_rms_norm(const void* source, DType source_dtype, float* x, const float* weight,
                           int64_t rows, int64_t d, float eps, float* y, DeviceStream stream,
                           RoundedOutput rounded) {
  // An fp32 source, or one that the vector path could not read four at a time, is copied apart.
  if (source_dtype == DType::kF32 || (norm_vector_path(x, weight, d, y, rounded) && !aligned_to(source, 8))) {
    launch_convert(source, source_dtype, x, DType::kF32, rows * d, stream);
    launch_rms_norm(x, weight, rows, d, eps, y, stream, rounded);
    return;
  }
  if (source_dtype == DType::kBF16)
    launch_rms_norm_of<NormInput::kWidenedBf16>(x, source, weight, rows, d, eps, y, stream, rounded);
  else
    launch_rms_norm_of<NormInput::kWidenedFp16>(x, source, weight, rows, d, eps, y, stream, rounded);
}

void launch_layer_norm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t d,
                       float eps, float* y, DeviceStream stream) {
  if (rows <= 0 || d <= 0) return;
  SYMPRUNE_LAUNCH(layer_norm_kernel, static_cast<unsigned>(rows), kThreads, 0, native(stream), x, weight,
                  bias, d, eps, y);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_rope(float* x, int64_t rows, int64_t seq_len, int64_t n_heads, int64_t half,
                 const float* cos_table, const float* sin_table, DeviceStream stream, RoundedOutput rounded,
                 bool write_fp32) {
  const int64_t pairs = rows * n_heads * half;
  if (pairs <= 0) return;
  auto* rounded_data = static_cast<uint16_t*>(rounded.data);
  if (half % 4 == 0 && aligned16(x, cos_table, sin_table) && aligned_to(rounded_data, 8))
    SYMPRUNE_LAUNCH(rope4_kernel, grid_for(pairs / 4), kThreads, 0, native(stream), x, rows, seq_len, n_heads,
                    half, cos_table, sin_table, rounded_data, rounded.dtype == DType::kBF16, write_fp32);
  else
    SYMPRUNE_LAUNCH(rope_kernel, grid_for(pairs), kThreads, 0, native(stream), x, rows, seq_len, n_heads,
                    half, cos_table, sin_table, rounded_data, rounded.dtype == DType::kBF16, write_fp32);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out, DeviceStream stream,
                     RoundedOutput rounded) {
  if (count <= 0) return;
  auto* rounded_data = static_cast<uint16_t*>(rounded.data);
  const bool vector = aligned16(gate, up, out) && aligned_to(rounded_data, 8);
  SYMPRUNE_LAUNCH(silu_mul_kernel, grid_for(vector ? count / 4 : count), kThreads, 0, native(stream), gate,
                  up, count, out, rounded_data, rounded.dtype == DType::kBF16, vector);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_relu(float* x, int64_t count, DeviceStream stream) {
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(relu_kernel, grid_for(count), kThreads, 0, native(stream), x, count);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_add(float* x, const float* y, int64_t count, DeviceStream stream) {
  launch_add_into(x, y, count, x, DType::kF32, stream);
}

void launch_add_into(const float* x, const float* y, int64_t count, void* out, DType out_dtype,
                     DeviceStream stream) {
  if (count <= 0) return;
  if (out_dtype == DType::kF32) {
    const bool vector = aligned16(x, y, out);
    SYMPRUNE_LAUNCH(add_kernel, grid_for(vector ? count / 4 : count), kThreads, 0, native(stream), x, y,
                    count, static_cast<float*>(out), vector);
  } else {
    const bool vector = aligned16(x, y) && aligned_to(out, 8);
    SYMPRUNE_LAUNCH(add_round_kernel, grid_for(vector ? count / 4 : count), kThreads, 0, native(stream), x, y,
                    count, static_cast<uint16_t*>(out), out_dtype == DType::kBF16, vector);
  }
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_embedding(const float* table, const int32_t* ids, int64_t count, int64_t d, float* out,
                      DeviceStream stream) {
  if (count <= 0 || d <= 0) return;
  SYMPRUNE_LAUNCH(embedding_kernel, grid_for(count * d), kThreads, 0, native(stream), table, ids, count, d,
                  out);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_add_position_rows(float* x, const float* table, int64_t rows, int64_t seq_len, int64_t row_offset,
                              int64_t d, DeviceStream stream) {
  if (rows <= 0 || d <= 0) return;
  SYMPRUNE_LAUNCH(add_position_rows_kernel, grid_for(rows * d), kThreads, 0, native(stream), x, table, rows,
                  seq_len, row_offset, d);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_attention(const float* q, const float* k, const float* v, int64_t n_seqs, int64_t seq_len,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                      DeviceStream stream, int64_t seqs_per_launch) {
  if (n_seqs <= 0 || seq_len <= 0) return;
  if (head_dim <= 0 || head_dim > kMaxHeadDim || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw_argument_error("attention: head_dim " + std::to_string(head_dim) + " (at most 256) with " +
                         std::to_string(n_heads) + " heads and " + std::to_string(n_kv_heads) + " kv heads");
  // Two staged tiles of tile_keys × hd floats stay within the 48 KiB of shared memory without opt-in.
  const int tile_keys = head_dim <= 128 ? 32 : 16;
  const size_t shared = 2 * static_cast<size_t>(tile_keys) * static_cast<size_t>(head_dim) * sizeof(float);
  if (n_heads > kMaxGridYz)
    throw_argument_error("attention: " + std::to_string(n_heads) + " heads exceed the grid");
  // Sequences along z.
  const int64_t q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
  for_each_grid_slice(n_seqs, seqs_per_launch, [&](int64_t first, int64_t seqs) {
    const int64_t row = first * seq_len;
    const dim3 grid(static_cast<unsigned>((seq_len + kWarps - 1) / kWarps), static_cast<unsigned>(n_heads),
                    static_cast<unsigned>(seqs));
    SYMPRUNE_LAUNCH(attention_kernel, grid, kThreads, shared, native(stream), q + row * q_width,
                    k + row * kv_width, v + row * kv_width, seq_len, n_heads, n_heads / n_kv_heads, head_dim,
                    tile_keys, scale, out + row * q_width);
    SYMPRUNE_CHECK_LAUNCH();
  });
}

}  // namespace symprune::cuda
