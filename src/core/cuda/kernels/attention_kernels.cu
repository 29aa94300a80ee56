// The kernels of the 16-bit attention (see attention_kernels.h): the causal softmax of the GEMM path (one
// warp per score row, fp32 max and sum reduced by shuffles, probabilities rounded to 16 bits for the
// tensor-core product with V), and the fused flash attention.
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

// Flash attention (FlashAttention-2's loop order) on warp matrix functions. A block of kFlashWarps warps
// takes kFlashRows queries of one head of one sequence; each warp owns 16 of them, their Q in operand
// fragments and their O in fp32 accumulators for the whole loop. Per tile of kFlashKeys keys (K and V
// staged in shared memory by the block): S = Q Kᵀ on tensor cores into shared memory, the online softmax
// in fp32 by lane pairs (one row each: its max, the rescale of O and l), P rounded to the 16-bit dtype,
// O = O·α + P V. Rows of accumulators are found through a fragment loaded from a matrix of row indices, so
// nothing depends on the fragments' unspecified layout. Memory: 30 KB of shared memory per block, no
// scores in global memory at all.
constexpr int kFlashWarps = 4;
constexpr int kFlashRows = 16 * kFlashWarps;
constexpr int kFlashKeys = 32;
constexpr int kFlashMaxHead = 128;

template <typename Element, int kHead>
__global__ void __launch_bounds__(kFlashWarps * 32)
    flash_attention_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                           const uint16_t* __restrict__ v, int64_t seq_len, int n_heads, int group,
                           float scale, float* __restrict__ out) {
  using namespace nvcuda;
  static_assert(kHead % 16 == 0 && kHead <= kFlashMaxHead);
  constexpr int kSteps = kHead / 16, kPairs = kHead / 2;
  // The Q tile (kFlashRows × kHead) first, then the K and V tiles (kFlashKeys × kHead each).
  alignas(32) __shared__ uint16_t tiles[2 * kFlashKeys * kFlashMaxHead];
  alignas(32) __shared__ float scores[kFlashWarps][16 * kFlashKeys];
  alignas(32) __shared__ uint16_t probs[kFlashWarps][16 * kFlashKeys];
  alignas(32) __shared__ float row_index[16 * 16];
  __shared__ float row_factor[kFlashWarps][16];
  const auto elements = [](const uint16_t* p) { return reinterpret_cast<const Element*>(p); };

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kFlashRows, warp_q0 = q0 + warp * 16;
  const int head = static_cast<int>(blockIdx.y), kv_head = head / group;
  const int64_t seq = blockIdx.z;
  const int64_t q_width = static_cast<int64_t>(n_heads) * kHead, kv_width = q_width / group;
  const uint16_t* q_seq = q + seq * seq_len * q_width + head * kHead;
  const uint16_t* k_seq = k + seq * seq_len * kv_width + kv_head * kHead;
  const uint16_t* v_seq = v + seq * seq_len * kv_width + kv_head * kHead;

  for (int i = static_cast<int>(threadIdx.x); i < 16 * 16; i += kFlashWarps * 32)
    row_index[i] = static_cast<float>(i / 16);
  for (int i = static_cast<int>(threadIdx.x); i < kFlashRows * kPairs; i += kFlashWarps * 32) {
    const int r = i / kPairs, c = i % kPairs;
    store_pair(tiles + r * kHead + 2 * c,
               q0 + r < seq_len ? load_pair(q_seq + (q0 + r) * q_width + 2 * c) : 0u);
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, Element, wmma::row_major> q_frag[kSteps];
  SYMPRUNE_UNROLL
  for (int d = 0; d < kSteps; ++d)
    wmma::load_matrix_sync(q_frag[d], elements(tiles + warp * 16 * kHead + d * 16), kHead);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> rows;
  wmma::load_matrix_sync(rows, row_index, 16, wmma::mem_row_major);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag[kSteps];
  SYMPRUNE_UNROLL
  for (int d = 0; d < kSteps; ++d) wmma::fill_fragment(o_frag[d], 0.0f);
  // Lanes 2r and 2r + 1 hold row r's running max and sum (the same values), each reading half its keys.
  const int my_row = lane / 2, half = lane % 2;
  const int64_t query = warp_q0 + my_row;
  float row_max = -INFINITY, row_sum = 0.0f;
  const uint16_t* k_tile = tiles;
  const uint16_t* v_tile = tiles + kFlashKeys * kHead;
  const int64_t key_end = q0 + kFlashRows < seq_len ? q0 + kFlashRows : seq_len;
  __syncthreads();  // every warp has its Q before the tiles hold K and V
  for (int64_t k0 = 0; k0 < key_end; k0 += kFlashKeys) {
    for (int i = static_cast<int>(threadIdx.x); i < kFlashKeys * kPairs; i += kFlashWarps * 32) {
      const int r = i / kPairs, c = i % kPairs;
      const bool inside = k0 + r < seq_len;  // keys past the end are zeros (never NaN times 0 below)
      store_pair(tiles + r * kHead + 2 * c, inside ? load_pair(k_seq + (k0 + r) * kv_width + 2 * c) : 0u);
      store_pair(tiles + (kFlashKeys + r) * kHead + 2 * c,
                 inside ? load_pair(v_seq + (k0 + r) * kv_width + 2 * c) : 0u);
    }
    __syncthreads();
    if (k0 <= warp_q0 + 15) {  // some key of the tile is visible to a query of this warp (warp-uniform)
      SYMPRUNE_UNROLL
      for (int j = 0; j < kFlashKeys / 16; ++j) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
        wmma::fill_fragment(s, 0.0f);
        SYMPRUNE_UNROLL
        for (int d = 0; d < kSteps; ++d) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, wmma::col_major> k_frag;
          wmma::load_matrix_sync(k_frag, elements(k_tile + j * 16 * kHead + d * 16), kHead);
          wmma::mma_sync(s, q_frag[d], k_frag, s);
        }
        wmma::store_matrix_sync(scores[warp] + j * 16, s, kFlashKeys, wmma::mem_row_major);
      }
      __syncwarp();
      constexpr int kPerLane = kFlashKeys / 2;
      float values[kPerLane];
      float tile_max = -INFINITY;
      SYMPRUNE_UNROLL
      for (int c = 0; c < kPerLane; ++c) {
        const int column = half * kPerLane + c;
        const int64_t key = k0 + column;
        const float value =
            key <= query && key < seq_len ? scores[warp][my_row * kFlashKeys + column] * scale : -INFINITY;
        values[c] = value;
        tile_max = fmaxf(tile_max, value);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float new_max = fmaxf(row_max, tile_max);
      const float shift = new_max == -INFINITY ? 0.0f : new_max;  // a row that sees no key yet stays 0
      const float factor = expf(row_max - shift);
      float tile_sum = 0.0f;
      SYMPRUNE_UNROLL
      for (int c = 0; c < kPerLane; ++c) {
        const float p = expf(values[c] - shift);
        tile_sum += p;
        probs[warp][my_row * kFlashKeys + half * kPerLane + c] =
            std::is_same_v<Element, __nv_bfloat16> ? float_to_bf16_bits(p) : float_to_fp16_bits(p);
      }
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
      row_sum = row_sum * factor + tile_sum;
      row_max = new_max;
      if (half == 0) row_factor[warp][my_row] = factor;
      __syncwarp();
      SYMPRUNE_UNROLL
      for (int d = 0; d < kSteps; ++d)
        for (int i = 0; i < o_frag[d].num_elements; ++i)
          o_frag[d].x[i] *= row_factor[warp][static_cast<int>(rows.x[i])];
      SYMPRUNE_UNROLL
      for (int j = 0; j < kFlashKeys / 16; ++j) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, Element, wmma::row_major> p_frag;
        wmma::load_matrix_sync(p_frag, elements(probs[warp] + j * 16), kFlashKeys);
        SYMPRUNE_UNROLL
        for (int d = 0; d < kSteps; ++d) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, wmma::row_major> v_frag;
          wmma::load_matrix_sync(v_frag, elements(v_tile + j * 16 * kHead + d * 16), kHead);
          wmma::mma_sync(o_frag[d], p_frag, v_frag, o_frag[d]);
        }
      }
      __syncwarp();  // the factors are read before the next tile writes them
    }
    __syncthreads();  // the tiles are read before the next ones are staged
  }
  if (half == 0) row_factor[warp][my_row] = 1.0f / row_sum;
  __syncwarp();
  SYMPRUNE_UNROLL
  for (int d = 0; d < kSteps; ++d)
    for (int i = 0; i < o_frag[d].num_elements; ++i)
      o_frag[d].x[i] *= row_factor[warp][static_cast<int>(rows.x[i])];
  const int64_t valid = seq_len - warp_q0 < 16 ? seq_len - warp_q0 : 16;
  float* out_rows = out + (seq * seq_len + warp_q0) * q_width + head * kHead;
  if (valid == 16) {
    SYMPRUNE_UNROLL
    for (int d = 0; d < kSteps; ++d)
      wmma::store_matrix_sync(out_rows + d * 16, o_frag[d], static_cast<unsigned>(q_width),
                              wmma::mem_row_major);
  } else if (valid > 0) {  // the last rows of a sequence: through shared memory, the rows that exist only
    for (int d = 0; d < kSteps; ++d) {
      wmma::store_matrix_sync(scores[warp], o_frag[d], 16, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < valid * 16; i += 32)
        out_rows[(i / 16) * q_width + d * 16 + i % 16] = scores[warp][i];
      __syncwarp();
    }
  }
}

template <typename Element>
void launch_flash_of(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs, int64_t seq_len,
                     int n_heads, int group, int head_dim, float scale, float* out, DeviceStream stream) {
  const dim3 grid(static_cast<unsigned>((seq_len + kFlashRows - 1) / kFlashRows),
                  static_cast<unsigned>(n_heads), static_cast<unsigned>(n_seqs));
  auto* kernel = head_dim == 16   ? flash_attention_kernel<Element, 16>
                 : head_dim == 32 ? flash_attention_kernel<Element, 32>
                 : head_dim == 64 ? flash_attention_kernel<Element, 64>
                                  : flash_attention_kernel<Element, 128>;
  SYMPRUNE_LAUNCH(kernel, grid, kFlashWarps * 32, 0, native(stream), q, k, v, seq_len, n_heads, group, scale,
                  out);
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void launch_flash_attention_16bit(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  float scale, DType dtype, float* out, DeviceStream stream) {
  if (n_seqs <= 0 || seq_len <= 0) return;
  if (!flash_attention_supports(head_dim) || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 ||
      n_heads > 65535 || n_seqs > 65535 || (dtype != DType::kBF16 && dtype != DType::kF16))
    throw_argument_error(
        "flash attention: a head size other than 16, 32, 64 or 128, heads that do not group, "
        "over 65535 heads or sequences, or not a 16-bit dtype");
  const int heads = static_cast<int>(n_heads), group = static_cast<int>(n_heads / n_kv_heads);
  if (dtype == DType::kBF16)
    launch_flash_of<__nv_bfloat16>(q, k, v, n_seqs, seq_len, heads, group, static_cast<int>(head_dim), scale,
                                   out, stream);
  else
    launch_flash_of<__half>(q, k, v, n_seqs, seq_len, heads, group, static_cast<int>(head_dim), scale, out,
                            stream);
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
