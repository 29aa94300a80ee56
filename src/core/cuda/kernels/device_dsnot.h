#pragma once
// Host-only header: core::refine_dsnot and core::initial_column_l1 for a weight held on the device
// (dsnot_kernels.h), with the CPU's checks, errors and results. The mask crosses the bus bit-packed both
// ways; the weight stays where it is.
#include <optional>
#include <vector>

#include "core/cuda/device_memory.h"
#include "core/refine_dsnot.h"

namespace symprune::cuda {

// `weight`: an fp32 device tensor [rows, n].
RefineStats refine_dsnot_on_device(const Tensor& weight, const std::vector<double>& mu,
                                   const std::vector<double>& var, const std::vector<double>& act_norm,
                                   Mask& mask, const DsnotOptions& options, std::optional<NmPattern> nm,
                                   const std::vector<double>* column_l1);

std::vector<double> initial_column_l1_on_device(const Tensor& weight, const Mask& mask);

// Blocks of one refinement of rows [rows, n]: enough to fill an H100 (132 SMs × 8 blocks of 256 threads),
// fewer when their scratch (dsnot_scratch_bytes_per_block each, at most 26·n + 8 bytes whatever max_cycles:
// the swap loop reads at most n entries of an order) would pass kDeviceRefineScratchBytes, the plan's
// allowance (24 MB at n = 11008 and 50 cycles); at least 1, whose scratch passes it only for n above 2.5 M.
int dsnot_blocks(int64_t rows, int64_t n, int max_cycles);

}  // namespace symprune::cuda
