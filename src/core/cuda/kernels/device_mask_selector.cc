// MaskSelector on device scores (see device_mask_selector.h): each step is a kernel of mask_kernels.cu;
// only histograms, per-row counts and the packed mask cross to the host.
#include "core/cuda/kernels/device_mask_selector.h"

#include <bit>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/cuda/kernels/mask_kernels.h"
#include "core/error.h"

namespace symprune::cuda {

DeviceMaskSelector::DeviceMaskSelector(const float* scores, int64_t rows, int64_t cols)
    : scores_(scores), rows_(rows), cols_(cols), mask_(rows * cols) {
  mask_.zero();
}

int64_t DeviceMaskSelector::first_nan() {
  return first_index_on_device([&](int64_t* first) { launch_first_nan(scores_, rows_ * cols_, first, {}); });
}

void DeviceMaskSelector::select_rows(int64_t k) {
  if (k > 0) launch_select_rows(scores_, rows_, cols_, k, mask_.data(), {});
}

void DeviceMaskSelector::select_nm(int n, int m) {
  launch_select_nm(scores_, rows_, cols_, n, m, mask_.data(), {});
}

void DeviceMaskSelector::key_histogram(uint32_t prefix, uint32_t prefix_mask, int shift,
                                       std::span<int64_t> hist) {
  SYMPRUNE_ASSERT(std::has_single_bit(hist.size()), "histogram of {} bins", hist.size());
  DeviceArray<int64_t> device_hist(static_cast<int64_t>(hist.size()));
  launch_key_histogram(scores_, rows_ * cols_, prefix, prefix_mask, shift, std::countr_zero(hist.size()),
                       device_hist.data(), {});
  copy_to_host(hist.data(), device_hist.data(), hist.size_bytes());
}

void DeviceMaskSelector::prune_below_key(uint32_t threshold_key, std::span<int64_t> equal_in_row) {
  DeviceArray<int64_t> equal(rows_);
  launch_prune_below_key(scores_, rows_, cols_, threshold_key, mask_.data(), equal.data(), {});
  if (rows_ > 0) copy_to_host(equal_in_row.data(), equal.data(), equal.bytes());
}

void DeviceMaskSelector::prune_first_equal(uint32_t threshold_key, std::span<const int64_t> quota) {
  const DeviceArray<int64_t> device_quota(quota.data(), static_cast<int64_t>(quota.size()));
  launch_prune_first_equal(scores_, rows_, cols_, threshold_key, device_quota.data(), mask_.data(), {});
}

void DeviceMaskSelector::prune_at_most(float theta) {
  launch_prune_at_most(scores_, rows_ * cols_, theta, mask_.data(), {});
}

Mask DeviceMaskSelector::take_mask() {
  Mask mask = download_mask(mask_.data(), rows_, cols_);
  mask_ = DeviceArray<uint8_t>();
  return mask;
}

const uint8_t* device_bits_of(const Mask& mask, DeviceArray<uint8_t>& upload) {
  const auto* kept = dynamic_cast<const DeviceMaskBits*>(mask.backend_bits());
  if (kept != nullptr && kept->device == current_device()) {
    SYMPRUNE_ASSERT(kept->bits.size() == (mask.size() + 7) / 8,
                    "device bits: {} bytes for a mask of {} entries", kept->bits.size(), mask.size());
    return kept->bits.data();
  }
  std::vector<uint8_t> scratch;
  const std::span<const uint8_t> bits = mask.packed_bits(scratch);
  upload = DeviceArray<uint8_t>(bits.data(), static_cast<int64_t>(bits.size()));
  return upload.data();
}

DeviceArray<uint8_t> upload_mask(const Mask& mask) {
  DeviceArray<uint8_t> upload;
  const uint8_t* bits = device_bits_of(mask, upload);
  DeviceArray<uint8_t> bytes(mask.size());
  launch_unpack_mask_bits(bits, mask.size(), bytes.data(), {});
  return bytes;
}

Mask download_mask(const uint8_t* device_bytes, int64_t rows, int64_t cols) {
  auto kept = std::make_shared<DeviceMaskBits>();
  kept->bits = DeviceArray<uint8_t>((rows * cols + 7) / 8);
  kept->device = current_device();
  launch_pack_mask_bits(device_bytes, rows * cols, kept->bits.data(), {});
  // Unpacked on the host only if read entry by entry.
  std::vector<uint8_t> host = download_bytes(kept->bits.data(), kept->bits.bytes());
  return Mask::from_bits(rows, cols, std::move(host), std::move(kept));
}

Mask select_mask_on_device(const float* scores, int64_t rows, int64_t cols, const MaskSpec& spec,
                           std::string_view matrix_name, const MatrixPart* part) {
  DeviceMaskSelector selector(scores, rows, cols);
  return select_mask(selector, spec, matrix_name, part);
}

}  // namespace symprune::cuda
