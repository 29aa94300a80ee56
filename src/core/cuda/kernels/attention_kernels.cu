// The kernels of the 16-bit attention (see attention_kernels.h): the fused flash attention, and the causal
// softmax of the GEMM path (one warp per score row, fp32 max and sum reduced by shuffles, probabilities
// rounded to 16 bits for the tensor-core product with V).
#include <math.h>

#include <type_traits>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/attention_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda {
namespace {

using namespace kernels;

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    causal_softmax_kernel(const float* __restrict__ scores, int64_t rows, int64_t tile, int64_t keys,
                          int64_t first_query, uint16_t* __restrict__ probs) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* s = scores + row * keys;
    uint16_t* p = probs + row * keys;
    const int64_t visible = first_query + row % tile + 1;
    float max = -INFINITY;
    for (int64_t j = lane; j < visible; j += 32) max = s[j] > max ? s[j] : max;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullMask, max, offset);
      max = other > max ? other : max;
    }
    float sum = 0.0f;
    for (int64_t j = lane; j < visible; j += 32) sum += expf(s[j] - max);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < keys; j += 32) {
      const float value = j < visible ? expf(s[j] - max) * inv : 0.0f;
      p[j] = kBf16 ? float_to_bf16_bits(value) : float_to_fp16_bits(value);
    }
  }
}

// Flash attention in FlashAttention-2's register layout. A block of kFlashWarps warps takes the queries of
// one head of one sequence, each warp 16 · kRowTiles of them (kRowTiles row tiles of 16): their O as fp32
// accumulators in registers for the whole loop. Per tile of keys:
//   - K and V arrive in shared memory by cp.async, the next tile's copy overlapping this tile's products
//     (two stages); Q stays in shared memory, and its fragments are read per tile by ldmatrix;
//   - S = Q Kᵀ (mma.sync m16n8k16, K fragments by ldmatrix, each shared by the warp's row tiles) stays in
//     registers, where the online softmax runs in fp32 in base 2 (each row's max and sum over the 4 lanes
//     that hold it, by shuffles);
//   - P, rounded to the 16-bit dtype, is already laid out as the A fragments of O += P V (V fragments by
//     ldmatrix.trans, shared by the row tiles).
// More row tiles per warp means fewer fragment loads per product and more independent products, for more
// registers. Rows of shared memory are padded by 8 elements (16 bytes) so that the 8 rows an ldmatrix phase
// reads fall in different banks. Blocks of the last queries, which see the most keys, run first.
constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = 32 * kFlashWarps;
template <int kRowTiles>
constexpr int kFlashRows = kFlashWarps * 16 * kRowTiles;  // queries per block
// Keys per tile: 64, or 32 with two row tiles (whose S would otherwise not fit in the registers).
template <int kRowTiles>
constexpr int kFlashKeys = kRowTiles == 1 ? 64 : 32;
template <int kHead>
constexpr int kFlashRowStride = kHead + 8;
template <int kHead, int kRowTiles>
constexpr size_t flash_shared_bytes() {  // the Q tile and two stages of a K and a V tile
  return (size_t{kFlashRows<kRowTiles>} + 4 * size_t{kFlashKeys<kRowTiles>}) * kFlashRowStride<kHead> *
         sizeof(uint16_t);
}

// acc[r][n] += a[r] · (b[0], b[1]) and acc[r][n + 1] += a[r] · (b[2], b[3]) for every row tile r: the B
// fragments of two 8-wide column tiles from one ldmatrix.x4, shared by the warp's row tiles.
template <bool kBf16, int kRowTiles, int kTiles>
__device__ __forceinline__ void mma_two_tiles(float (&acc)[kRowTiles][kTiles][4], int n,
                                              const uint32_t (&a)[kRowTiles][4], const uint32_t (&b)[4]) {
  const uint32_t first[2] = {b[0], b[1]}, second[2] = {b[2], b[3]};
  SYMPRUNE_UNROLL
  for (int r = 0; r < kRowTiles; ++r) {
    mma_m16n8k16<kBf16>(acc[r][n], a[r], first);
    mma_m16n8k16<kBf16>(acc[r][n + 1], a[r], second);
  }
}

template <bool kBf16, int kHead, int kRowTiles>
__global__ void __launch_bounds__(kFlashThreads)
    flash_attention_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                           const uint16_t* __restrict__ v, int64_t seq_len, int n_heads, int group,
                           float scale_log2, float* __restrict__ out, uint16_t* __restrict__ out_rounded) {
  static_assert(kHead % 16 == 0 && kHead <= 128);
  constexpr int kRows = kFlashRows<kRowTiles>;
  constexpr int kKeys = kFlashKeys<kRowTiles>;
  constexpr int kWarpRows = 16 * kRowTiles;
  constexpr int kStride = kFlashRowStride<kHead>;
  constexpr int kChunks = kHead / 8;    // 16-byte pieces of a row
  constexpr int kSteps = kHead / 16;    // k-steps of S = Q Kᵀ
  constexpr int kKeyTiles = kKeys / 8;  // 8-key column tiles of S
  constexpr int kDimTiles = kHead / 8;  // 8-wide column tiles of O
  SYMPRUNE_DYNAMIC_SHARED(uint16_t, tiles);
  uint16_t* const q_tile = tiles;
  const auto k_tile = [&](int stage) { return tiles + (kRows + (2 * stage) * kKeys) * kStride; };
  const auto v_tile = [&](int stage) { return tiles + (kRows + (2 * stage + 1) * kKeys) * kStride; };

  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32, lane = thread % 32, group_id = lane / 4, pair = 2 * (lane % 4);
  const int64_t q0 = (static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x) * kRows;
  const int64_t warp_q0 = q0 + warp * kWarpRows;
  const int head = static_cast<int>(blockIdx.y), kv_head = head / group;
  const int64_t seq = blockIdx.z;
  const int64_t q_width = static_cast<int64_t>(n_heads) * kHead, kv_width = q_width / group;
  const uint16_t* q_seq = q + seq * seq_len * q_width + head * kHead;
  const uint16_t* k_seq = k + seq * seq_len * kv_width + kv_head * kHead;
  const uint16_t* v_seq = v + seq * seq_len * kv_width + kv_head * kHead;
  // `count` rows from first_row on into a tile; rows past the sequence are zeros.
  const auto stage_rows = [&](uint16_t* tile, int count, const uint16_t* source, int64_t width,
                              int64_t first_row) {
    for (int i = thread; i < count * kChunks; i += kFlashThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool valid = first_row + r < seq_len;
      copy_async_16(tile + r * kStride + 8 * c, source + (valid ? (first_row + r) * width : 0) + 8 * c,
                    valid);
    }
  };
  const int64_t key_end = q0 + kRows < seq_len ? q0 + kRows : seq_len;
  const int n_tiles = static_cast<int>((key_end + kKeys - 1) / kKeys);

  stage_rows(q_tile, kRows, q_seq, q_width, q0);
  stage_rows(k_tile(0), kKeys, k_seq, kv_width, 0);
  stage_rows(v_tile(0), kKeys, v_seq, kv_width, 0);
  copy_async_commit();

  float o[kRowTiles][kDimTiles][4];
  SYMPRUNE_UNROLL
  for (int r = 0; r < kRowTiles; ++r) SYMPRUNE_UNROLL
  for (int d = 0; d < kDimTiles; ++d) o[r][d][0] = o[r][d][1] = o[r][d][2] = o[r][d][3] = 0.0f;
  // Per lane and row tile r, rows group_id (h = 0: elements 0, 1) and group_id + 8 (h = 1: elements 2, 3):
  // the running max (base 2, scaled) and this lane's part of the running sum.
  float row_max[kRowTiles][2], row_sum[kRowTiles][2];
  SYMPRUNE_UNROLL
  for (int r = 0; r < kRowTiles; ++r) {
    row_max[r][0] = row_max[r][1] = -INFINITY;
    row_sum[r][0] = row_sum[r][1] = 0.0f;
  }
  const bool warp_has_queries = warp_q0 < seq_len;
  // Fragment rows and columns of this lane's ldmatrix address: A of Q (matrices rows 0-7 | 8-15 × columns
  // 0-7 | 8-15 of a step), B of K (keys of tile n | n + 1 × columns 0-7 | 8-15 of a step), B of V (keys 0-7
  // | 8-15 × dimensions of tile d | d + 1).
  const int q_row = warp * kWarpRows + lane % 8 + 8 * ((lane / 8) % 2), q_column = 8 * (lane / 16);
  const int k_row = lane % 8 + 8 * (lane / 16), k_column = 8 * ((lane / 8) % 2);
  const int v_row = lane % 8 + 8 * ((lane / 8) % 2), v_column = 8 * (lane / 16);
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % 2;
    if (j + 1 < n_tiles) {
      stage_rows(k_tile(1 - stage), kKeys, k_seq, kv_width, int64_t{j + 1} * kKeys);
      stage_rows(v_tile(1 - stage), kKeys, v_seq, kv_width, int64_t{j + 1} * kKeys);
      copy_async_commit();
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
    const int64_t k0 = int64_t{j} * kKeys;
    if (warp_has_queries && k0 <= warp_q0 + kWarpRows - 1) {  // warp-uniform: a key visible to the warp
      float s[kRowTiles][kKeyTiles][4];
      SYMPRUNE_UNROLL
      for (int r = 0; r < kRowTiles; ++r) SYMPRUNE_UNROLL
      for (int n = 0; n < kKeyTiles; ++n) s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = 0.0f;
      // Unrolled by two only: fully unrolled, the compiler loads every step's Q fragments at once and spills.
      SYMPRUNE_UNROLL_BY(2)
      for (int step = 0; step < kSteps; ++step) {
        uint32_t a[kRowTiles][4];
        SYMPRUNE_UNROLL
        for (int r = 0; r < kRowTiles; ++r)
          load_matrix_x4(a[r], q_tile + (q_row + 16 * r) * kStride + 16 * step + q_column);
        SYMPRUNE_UNROLL
        for (int n = 0; n < kKeyTiles; n += 2) {
          uint32_t b[4];
          load_matrix_x4(b, k_tile(stage) + (8 * n + k_row) * kStride + 16 * step + k_column);
          mma_two_tiles<kBf16>(s, n, a, b);
        }
      }
      // Scaled to base 2; keys after a query or past the sequence are -inf (only in the tiles at the edge).
      const bool edge = k0 + kKeys - 1 > warp_q0 || k0 + kKeys > seq_len;
      SYMPRUNE_UNROLL
      for (int r = 0; r < kRowTiles; ++r) SYMPRUNE_UNROLL
      for (int n = 0; n < kKeyTiles; ++n) SYMPRUNE_UNROLL
      for (int i = 0; i < 4; ++i) {
        float value = s[r][n][i] * scale_log2;
        if (edge) {
          const int64_t key = k0 + 8 * n + pair + i % 2;
          const int64_t query = warp_q0 + 16 * r + group_id + 8 * (i / 2);
          if (key > query || key >= seq_len) value = -INFINITY;
        }
        s[r][n][i] = value;
      }
      SYMPRUNE_UNROLL
      for (int r = 0; r < kRowTiles; ++r) SYMPRUNE_UNROLL
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
        SYMPRUNE_UNROLL
        for (int n = 0; n < kKeyTiles; ++n)
          tile_max = fmaxf(tile_max, fmaxf(s[r][n][2 * h], s[r][n][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[r][h], tile_max);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row that sees no key yet stays 0
        const float factor = exp2f(row_max[r][h] - base);
        float tile_sum = 0.0f;
        SYMPRUNE_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
          s[r][n][2 * h] = exp2f(s[r][n][2 * h] - base);
          s[r][n][2 * h + 1] = exp2f(s[r][n][2 * h + 1] - base);
          tile_sum += s[r][n][2 * h] + s[r][n][2 * h + 1];
        }
        row_sum[r][h] = row_sum[r][h] * factor + tile_sum;
        row_max[r][h] = new_max;
        SYMPRUNE_UNROLL
        for (int d = 0; d < kDimTiles; ++d) {
          o[r][d][2 * h] *= factor;
          o[r][d][2 * h + 1] *= factor;
        }
      }
      // O += P V per 16 keys: P's accumulators of key tiles 2kk and 2kk + 1 are the A fragment.
      SYMPRUNE_UNROLL
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t a[kRowTiles][4];
        SYMPRUNE_UNROLL
        for (int r = 0; r < kRowTiles; ++r) {
          a[r][0] = pack_pair<kBf16>(s[r][2 * kk][0], s[r][2 * kk][1]);
          a[r][1] = pack_pair<kBf16>(s[r][2 * kk][2], s[r][2 * kk][3]);
          a[r][2] = pack_pair<kBf16>(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
          a[r][3] = pack_pair<kBf16>(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
        }
        SYMPRUNE_UNROLL
        for (int d = 0; d < kDimTiles; d += 2) {
          uint32_t b[4];
          load_matrix_x4_trans(b, v_tile(stage) + (16 * kk + v_row) * kStride + 8 * d + v_column);
          mma_two_tiles<kBf16>(o, d, a, b);
        }
      }
    }
    __syncthreads();  // the stage is read before it is refilled
  }
  SYMPRUNE_UNROLL
  for (int r = 0; r < kRowTiles; ++r) SYMPRUNE_UNROLL
  for (int h = 0; h < 2; ++h) {
    float total = row_sum[r][h];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int64_t query = warp_q0 + 16 * r + group_id + 8 * h;
    if (query >= seq_len) continue;
    const float inverse = 1.0f / total;
    const int64_t first = (seq * seq_len + query) * q_width + head * kHead + pair;
    SYMPRUNE_UNROLL
    for (int d = 0; d < kDimTiles; ++d) {
      const float low = o[r][d][2 * h] * inverse, high = o[r][d][2 * h + 1] * inverse;
      if (out != nullptr) {
        out[first + 8 * d] = low;
        out[first + 8 * d + 1] = high;
      }
      if (out_rounded != nullptr) {
        out_rounded[first + 8 * d] = kBf16 ? float_to_bf16_bits(low) : float_to_fp16_bits(low);
        out_rounded[first + 8 * d + 1] = kBf16 ? float_to_bf16_bits(high) : float_to_fp16_bits(high);
      }
    }
  }
}

template <bool kBf16, int kHead, int kRowTiles>
void launch_flash_of(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs, int64_t seq_len,
                     int n_heads, int group, float scale, float* out, uint16_t* out_rounded,
                     DeviceStream stream) {
  constexpr int kRows = kFlashRows<kRowTiles>;
  const dim3 grid(static_cast<unsigned>((seq_len + kRows - 1) / kRows), static_cast<unsigned>(n_heads),
                  static_cast<unsigned>(n_seqs));
  auto* kernel = flash_attention_kernel<kBf16, kHead, kRowTiles>;
  constexpr size_t kShared = flash_shared_bytes<kHead, kRowTiles>();
  SYMPRUNE_ALLOW_DYNAMIC_SHARED(kernel, kShared);
  const float log2_e = 1.4426950408889634f;
  SYMPRUNE_LAUNCH(kernel, grid, kFlashThreads, kShared, native(stream), q, k, v, seq_len, n_heads, group,
                  scale * log2_e, out, out_rounded);
  SYMPRUNE_CHECK_LAUNCH();
}

template <bool kBf16, int kRowTiles>
void launch_flash_of_rows(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                          int64_t seq_len, int n_heads, int group, int head_dim, float scale, float* out,
                          uint16_t* out_rounded, DeviceStream stream) {
  const auto launch = [&](auto head) {
    launch_flash_of<kBf16, decltype(head)::value, kRowTiles>(q, k, v, n_seqs, seq_len, n_heads, group, scale,
                                                             out, out_rounded, stream);
  };
  switch (head_dim) {
    case 16:
      return launch(std::integral_constant<int, 16>{});
    case 32:
      return launch(std::integral_constant<int, 32>{});
    case 64:
      return launch(std::integral_constant<int, 64>{});
    default:
      return launch(std::integral_constant<int, 128>{});
  }
}

template <bool kBf16>
void launch_flash_of_head(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                          int64_t seq_len, int n_heads, int group, int head_dim, float scale, float* out,
                          uint16_t* out_rounded, int rows_per_warp, DeviceStream stream) {
  if (rows_per_warp == 16)
    launch_flash_of_rows<kBf16, 1>(q, k, v, n_seqs, seq_len, n_heads, group, head_dim, scale, out,
                                   out_rounded, stream);
  else
    launch_flash_of_rows<kBf16, 2>(q, k, v, n_seqs, seq_len, n_heads, group, head_dim, scale, out,
                                   out_rounded, stream);
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void launch_flash_attention_16bit(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  float scale, DType dtype, float* out, uint16_t* out_rounded,
                                  DeviceStream stream, int rows_per_warp) {
  if (n_seqs <= 0 || seq_len <= 0) return;
  if (!flash_attention_supports(head_dim) || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 ||
      n_heads > 65535 || n_seqs > 65535 || (dtype != DType::kBF16 && dtype != DType::kF16) ||
      (rows_per_warp != 16 && rows_per_warp != 32))
    throw_argument_error(
        "flash attention: a head size other than 16, 32, 64 or 128, heads that do not group, "
        "over 65535 heads or sequences, not a 16-bit dtype, or rows per warp other than 16 or 32");
  const int heads = static_cast<int>(n_heads), group = static_cast<int>(n_heads / n_kv_heads);
  const int hd = static_cast<int>(head_dim);
  if (dtype == DType::kBF16)
    launch_flash_of_head<true>(q, k, v, n_seqs, seq_len, heads, group, hd, scale, out, out_rounded,
                               rows_per_warp, stream);
  else
    launch_flash_of_head<false>(q, k, v, n_seqs, seq_len, heads, group, hd, scale, out, out_rounded,
                                rows_per_warp, stream);
}

void launch_causal_softmax_16bit(const float* scores, int64_t heads, int64_t tile, int64_t keys,
                                 int64_t first_query, DType dtype, void* probs, DeviceStream stream) {
  const int64_t rows = heads * tile;
  if (rows <= 0 || keys <= 0) return;
  if (first_query + tile > keys || (dtype != DType::kBF16 && dtype != DType::kF16))
    throw_argument_error("causal softmax: a tile past its keys, or not a 16-bit dtype");
  const int64_t blocks_needed = (rows + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(blocks_needed < 65535 ? blocks_needed : 65535));
  auto* kernel = dtype == DType::kBF16 ? causal_softmax_kernel<true> : causal_softmax_kernel<false>;
  SYMPRUNE_LAUNCH(kernel, grid, kThreads, 0, native(stream), scores, rows, tile, keys, first_query,
                  static_cast<uint16_t*>(probs));
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
