#pragma once
// A CPU emulation of CUDA's warp matrix functions (nvcuda::wmma, <mma.h>) for the 16 × 16 × 16 shape with
// bf16 or fp16 operands and fp32 accumulators, for the kernels built against core/cuda/emulation.
//
// Every thread of the warp holds the whole tile (num_elements = 256, row-major: element i is row i / 16,
// column i % 16). A kernel that applies one operation to every element, or finds an element's row through
// an accumulator loaded from a matrix of row indices, therefore computes what it computes on a GPU, whose
// layout is unspecified. Products are exact in fp32 and summed in fp32, as on tensor cores (whose order of
// summation is unspecified too). A store is made by lane 0 and followed by a warp barrier, so the 32 copies
// never write the same memory at once; as on a GPU, all 32 lanes must make every call.
#include <cstdint>
#include <cstring>

#include "core/cuda/emulation/emulated_cuda.h"
#include "core/dtype.h"

// CUDA's 16-bit types, as their bit patterns (only the wmma loads read them).
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16 x 16 x 16 shape only");
  static constexpr int num_elements = 256;
  float x[256];  // row-major; operands hold their 16-bit values widened
};

namespace detail {
inline float widen(const __nv_bfloat16* p, int64_t index) {
  uint16_t bits;
  std::memcpy(&bits, reinterpret_cast<const char*>(p) + index * 2, sizeof bits);
  return symprune::bf16_to_float(bits);
}
inline float widen(const __half* p, int64_t index) {
  uint16_t bits;
  std::memcpy(&bits, reinterpret_cast<const char*>(p) + index * 2, sizeof bits);
  return symprune::fp16_to_float(bits);
}
}  // namespace detail

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
  for (float& v : f.x) v = value;
}

// Operands: matrix_a is M × K (element (r, k)), matrix_b is K × N (element (k, n)); x holds them row-major.
template <typename T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = detail::widen(p, int64_t{r} * ldm + c);
}
template <typename T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, col_major>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = detail::widen(p, int64_t{c} * ldm + r);
}
template <typename T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = detail::widen(p, int64_t{k} * ldm + n);
}
template <typename T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major>& f, const T* p, unsigned ldm) {
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = detail::widen(p, int64_t{n} * ldm + k);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = layout == mem_row_major ? p[int64_t{r} * ldm + c] : p[int64_t{c} * ldm + r];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  if (symprune::cuda::emulation::lane_id() == 0) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c)
        (layout == mem_row_major ? p[int64_t{r} * ldm + c] : p[int64_t{c} * ldm + r]) = f.x[r * 16 + c];
  }
  __syncwarp();
}

// d = a b + c (d may be c).
template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float result[256];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float sum = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) sum += a.x[r * 16 + k] * b.x[k * 16 + n];
      result[r * 16 + n] = sum;
    }
  std::memcpy(d.x, result, sizeof result);
}

}  // namespace nvcuda::wmma
