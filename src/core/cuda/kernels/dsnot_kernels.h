#pragma once
// Host-only header: DSnoT and R²-DSnoT (core/refine_dsnot.h) on DEVICE pointers, one block per row, with
// the CPU's results bit for bit: the same fp32/fp64 operations (no FMA contraction), the same stable
// orders, and the fp64 row errors summed in column order. The block selects the few entries of each
// order that the swap loop can reach (radix select, core/refine_dsnot.cc's windows) instead of sorting
// the row, then one thread runs the row's swaps (at most max_cycles, each O(1), or O(M) for N:M).
// Plain C++17 types only: nvcc compiles the .cu file that includes it.
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// DsnotOptions (core/refine_dsnot.h) as the kernel reads them.
struct DsnotKernelOptions {
  int max_cycles = 50;
  double threshold = 0.1;
  bool divide_by_var = true;  // var_power != 0
  bool same_sign = false;     // options.same_sign (N:M applies the sign test anyway)
  int nm_m = 0;               // M of an N:M pattern, 0 for unstructured
  bool nm_prune_any_sign = false;  // options.nm_prune_any_sign
  bool r2 = false;            // R²-DSnoT keys; the rest is read only then
  bool grow_relative = true;
  bool prune_relative = true;
  int reg_p = 2;  // 1, 2, or 0 for ∞
  double gamma_grow = 0.0;
  double gamma_prune = 0.0;
};

// The per-column inputs (core::DsnotColumns) in device memory, n entries each; act_pow and col_inv_l1
// are read with r2 only.
struct DsnotDeviceColumns {
  const float* mu = nullptr;
  const float* var_pow = nullptr;
  const double* act_norm = nullptr;
  const double* act_pow = nullptr;
  const double* col_inv_l1 = nullptr;
};

// Per-row results in device memory, `rows` entries each.
struct DsnotRowResults {
  int64_t* swaps = nullptr;
  double* error_before = nullptr;
  double* error_after = nullptr;
};

// Device scratch one block needs for rows of n columns.
int64_t dsnot_scratch_bytes_per_block(int64_t n, int max_cycles);

// Refines mask [rows, n] (bytes, 1 = pruned) of weight [rows, n] (fp32) in place; `blocks` blocks (at
// most rows) each own dsnot_scratch_bytes_per_block bytes of `scratch` and take rows blocks apart.
void launch_dsnot_rows(const float* weight, int64_t rows, int64_t n, uint8_t* mask,
                       const DsnotDeviceColumns& columns, const DsnotKernelOptions& options,
                       const DsnotRowResults& results, void* scratch, int blocks, DeviceStream stream);

// col_l1[c] = Σ_r |weight[r, c]| over the kept entries (mask 0), fp64, in row order (initial_column_l1).
void launch_initial_column_l1(const float* weight, int64_t rows, int64_t n, const uint8_t* mask,
                              double* col_l1, DeviceStream stream);

}  // namespace symprune::cuda
