#pragma once
// A CPU emulation of the warp-wide matrix instructions the flash attention uses and of the vector
// accesses of the elementwise kernels (kernel_platform.cuh names them): mma.sync m16n8k16 with bf16 or fp16
// operands and fp32 accumulators, ldmatrix (x4, plain and transposed) and cp.async of 16 bytes. Fragments
// follow the PTX ISA's layouts exactly (lane L = 4·group + thread_in_group), so a kernel that gets a layout
// wrong gets wrong results here too. Each instruction gathers what the 32 lanes hold in one warp step (all 32
// lanes must make every call, as on a GPU). Products of 16-bit operands are exact in fp32 and summed in fp32
// in k order (a tensor core's order is unspecified). cp.async copies at once; its commit and wait are no-ops
// (the GPU's racecheck covers their ordering).
#include <cstdint>
#include <cstring>

#include "core/cuda/emulation/emulated_cuda.h"
#include "core/dtype.h"

namespace symprune::cuda {
namespace emulated_mma_detail {
template <bool kBf16>
float widen(uint16_t bits) {
  return kBf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}
// The element of a 32-bit register holding two 16-bit values: half 0 is the low 16 bits.
inline uint16_t half_of(uint32_t word, int half) {
  return static_cast<uint16_t>(half == 0 ? word & 0xFFFFu : word >> 16);
}
}  // namespace emulated_mma_detail

// d += a · b for a 16 × 16 A (row-major fragments) and a 16 × 8 B (column-major fragments).
template <bool kBf16>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  namespace e = ::symprune::cuda::emulation;
  using emulated_mma_detail::half_of;
  using emulated_mma_detail::widen;
  struct Fragments {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  e::warp_all_gather(0xffffffffu, &mine, sizeof mine, all);
  float matrix_a[16][16], matrix_b[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane / 4, pair = 2 * (lane % 4);
    for (int h = 0; h < 2; ++h) {
      // A: register 0 (group, pair), 1 (group + 8, pair), 2 (group, pair + 8), 3 (group + 8, pair + 8).
      matrix_a[group][pair + h] = widen<kBf16>(half_of(all[lane].a[0], h));
      matrix_a[group + 8][pair + h] = widen<kBf16>(half_of(all[lane].a[1], h));
      matrix_a[group][pair + 8 + h] = widen<kBf16>(half_of(all[lane].a[2], h));
      matrix_a[group + 8][pair + 8 + h] = widen<kBf16>(half_of(all[lane].a[3], h));
      // B (k × n): register 0 (k = pair, n = group), register 1 (k = pair + 8, n = group).
      matrix_b[pair + h][group] = widen<kBf16>(half_of(all[lane].b[0], h));
      matrix_b[pair + 8 + h][group] = widen<kBf16>(half_of(all[lane].b[1], h));
    }
  }
  // D: elements 0, 1 at (group, pair + 0/1), elements 2, 3 at (group + 8, pair + 0/1).
  const int lane = e::lane_id(), group = lane / 4, pair = 2 * (lane % 4);
  for (int i = 0; i < 4; ++i) {
    const int row = group + 8 * (i / 2), column = pair + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += matrix_a[row][k] * matrix_b[k][column];
    d[i] = sum;
  }
}

namespace emulated_mma_detail {
// ldmatrix .x4: lane L gives row L % 8 of matrix L / 8; register i of lane L receives two elements of
// matrix i: (row L / 4, columns 2·(L % 4) + 0/1), or with `transposed` (rows 2·(L % 4) + 0/1, column L / 4).
inline void load_matrix(uint32_t (&r)[4], const uint16_t* row, bool transposed) {
  namespace e = ::symprune::cuda::emulation;
  const uint16_t* rows[32];
  e::warp_all_gather(0xffffffffu, &row, sizeof row, rows);
  const int lane = e::lane_id();
  for (int i = 0; i < 4; ++i) {
    uint16_t element[2];
    for (int h = 0; h < 2; ++h) {
      const int r_index = transposed ? 2 * (lane % 4) + h : lane / 4;
      const int c_index = transposed ? lane / 4 : 2 * (lane % 4) + h;
      std::memcpy(&element[h], rows[8 * i + r_index] + c_index, sizeof(uint16_t));
    }
    r[i] = static_cast<uint32_t>(element[0]) | static_cast<uint32_t>(element[1]) << 16;
  }
}
}  // namespace emulated_mma_detail

inline void load_matrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  emulated_mma_detail::load_matrix(r, row, false);
}
inline void load_matrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  emulated_mma_detail::load_matrix(r, row, true);
}

inline void copy_async_16(uint16_t* shared, const uint16_t* global, bool valid) {
  if (valid)
    std::memcpy(shared, global, 16);
  else
    std::memset(shared, 0, 16);
}
inline void copy_async_commit() {}
template <int kPending>
void copy_async_wait() {}

// Four floats at p (16-byte aligned) as one access; four 16-bit values at p (8-byte aligned) as one store.
inline float4 load_float4(const float* p) {
  float4 value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
inline void store_float4(float* p, float4 value) {
  std::memcpy(p, &value, sizeof value);
}
inline void load_4x16(const uint16_t* p, uint16_t (&values)[4]) {
  std::memcpy(values, p, sizeof values);
}
inline void store_4x16(uint16_t* p, uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
  const uint16_t values[4] = {a, b, c, d};
  std::memcpy(p, values, sizeof values);
}

template <bool kBf16>
uint32_t pack_pair(float low, float high) {
  const auto round = [](float x) { return kBf16 ? float_to_bf16(x) : float_to_fp16(x); };
  return static_cast<uint32_t>(round(low)) | static_cast<uint32_t>(round(high)) << 16;
}

}  // namespace symprune::cuda

#define SYMPRUNE_ALLOW_DYNAMIC_SHARED(kernel, bytes) \
  ::symprune::cuda::emulation::opt_in_dynamic_shared(reinterpret_cast<const void*>(kernel), (bytes))
