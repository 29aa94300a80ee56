// DSnoT on device weights (see device_dsnot.h).
#include "core/cuda/kernels/device_dsnot.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/cuda/kernels/device_mask_selector.h"
#include "core/cuda/kernels/dsnot_kernels.h"
#include "core/error.h"

namespace symprune::cuda {
namespace {

DsnotKernelOptions kernel_options(const DsnotOptions& options, std::optional<NmPattern> nm) {
  DsnotKernelOptions k;
  k.max_cycles = options.max_cycles;
  k.threshold = options.threshold;
  k.divide_by_var = options.var_power != 0.0;
  k.same_sign = options.same_sign;
  k.nm_m = nm ? nm->m : 0;
  k.nm_prune_any_sign = options.nm_prune_any_sign;
  if (const auto& r2 = options.r2) {
    k.r2 = true;
    k.grow_relative = r2->grow_relative;
    k.prune_relative = r2->prune_relative;
    k.reg_p = std::isinf(r2->reg_p) ? 0 : static_cast<int>(r2->reg_p);
    k.gamma_grow = r2->gamma_grow;
    k.gamma_prune = r2->gamma_prune;
  }
  return k;
}

void check_device_weight(const Tensor& weight) {
  SYMPRUNE_ASSERT(
      weight.rank() == 2 && (weight.on_device() || weight.empty()) && weight.dtype() == DType::kF32,
      "DSnoT on the device: weight {} must be an fp32 device matrix", weight.shape_string());
}

}  // namespace

std::vector<double> initial_column_l1_on_device(const Tensor& weight, const Mask& mask) {
  check_device_weight(weight);
  SYMPRUNE_CHECK(mask.rows() == weight.dim(0) && mask.cols() == weight.dim(1),
                 "initial_column_l1: mask [{}, {}] does not match the weight {}", mask.rows(), mask.cols(),
                 weight.shape_string());
  const DeviceArray<uint8_t> device_mask = upload_mask(mask);
  DeviceArray<double> col_l1(weight.dim(1));
  if (weight.dim(0) == 0) col_l1.zero();
  launch_initial_column_l1(weight.device_data(), weight.dim(0), weight.dim(1), device_mask.data(),
                           col_l1.data(), {});
  return col_l1.download();
}

int dsnot_blocks(int64_t rows, int64_t n, int max_cycles) {
  constexpr int64_t kMaxBlocks = 1056;
  const int64_t by_memory =
      std::max<int64_t>(kDeviceRefineScratchBytes / dsnot_scratch_bytes_per_block(n, max_cycles), 1);
  return static_cast<int>(std::max<int64_t>(std::min({rows, kMaxBlocks, by_memory}), 1));
}

RefineStats refine_dsnot_on_device(const Tensor& weight, const std::vector<double>& mu,
                                   const std::vector<double>& var, const std::vector<double>& act_norm,
                                   Mask& mask, const DsnotOptions& options, std::optional<NmPattern> nm,
                                   const std::vector<double>* column_l1) {
  SYMPRUNE_CHECK(weight.rank() == 2, "DSnoT: weight must be a matrix [rows, cols], got shape {}",
                 weight.shape_string());
  check_device_weight(weight);
  const int64_t rows = weight.dim(0), n = weight.dim(1);
  check_dsnot_arguments(rows, n, weight.shape_string(), mu, var, act_norm, mask, options, nm, column_l1);
  const std::vector<double> col_l1 = !options.r2            ? std::vector<double>()
                                     : column_l1 != nullptr ? *column_l1
                                                            : initial_column_l1_on_device(weight, mask);
  const DsnotColumns host = dsnot_columns(mu, var, act_norm, options, col_l1);
  const DeviceArray<float> device_mu(host.mu), device_var_pow(host.var_pow);
  const DeviceArray<double> device_act_norm(host.act_norm), device_act_pow(host.act_pow),
      device_col_inv_l1(host.col_inv_l1);
  DeviceArray<uint8_t> device_mask = upload_mask(mask);
  DeviceArray<int64_t> swaps(rows);
  DeviceArray<double> before(rows), after(rows);
  const int64_t per_block = dsnot_scratch_bytes_per_block(n, options.max_cycles);
  const int blocks = dsnot_blocks(rows, n, options.max_cycles);
  DeviceArray<uint64_t> scratch(blocks * per_block / 8);
  const DsnotDeviceColumns columns{device_mu.data(), device_var_pow.data(), device_act_norm.data(),
                                   device_act_pow.data(), device_col_inv_l1.data()};
  launch_dsnot_rows(weight.device_data(), rows, n, device_mask.data(), columns, kernel_options(options, nm),
                    {swaps.data(), before.data(), after.data()}, scratch.data(), blocks, {});
  mask = download_mask(device_mask.data(), rows, n);
  return dsnot_totals(swaps.download(), before.download(), after.download());
}

}  // namespace symprune::cuda
