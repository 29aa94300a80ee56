#pragma once
// Host-only header: core::MaskSelector over scores in device memory, so select_mask's rules (counts, tie
// order, layer histograms summed over ranks, NaN errors) run unchanged on a GPU. The mask comes back to
// the host bit-packed (one eighth of the bytes).
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/masks.h"

namespace symprune::cuda {

class DeviceMaskSelector final : public MaskSelector {
 public:
  // `scores` is a device pointer to row-major fp32 [rows, cols]; it must outlive the selector.
  DeviceMaskSelector(const float* scores, int64_t rows, int64_t cols);

  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  int64_t first_nan() override;
  void select_rows(int64_t k) override;
  void select_nm(int n, int m) override;
  void key_histogram(uint32_t prefix, uint32_t prefix_mask, int shift, std::span<int64_t> hist) override;
  void prune_below_key(uint32_t threshold_key, std::span<int64_t> equal_in_row) override;
  void prune_first_equal(uint32_t threshold_key, std::span<const int64_t> quota) override;
  void prune_at_most(float theta) override;
  Mask take_mask() override;

  // The byte mask on the device (valid until take_mask).
  const uint8_t* device_mask() const { return mask_.data(); }

 private:
  const float* scores_;
  int64_t rows_, cols_;
  DeviceArray<uint8_t> mask_;
};

// A mask's packed bits in device memory, kept with the host mask (Mask::backend_bits) by download_mask.
struct DeviceMaskBits final : BackendBits {
  DeviceMaskBits() = default;
  DeviceMaskBits(const DeviceMaskBits&) = delete;
  DeviceMaskBits& operator=(const DeviceMaskBits&) = delete;
  // Freed on their own device: the mask's last copy may go on a thread that never chose one.
  ~DeviceMaskBits() override { device_free_on(device, bits.release()); }

  DeviceArray<uint8_t> bits;
  int device = 0;  // the device holding them
};

// The packed bits of `mask` on the current device: the ones it keeps there when it has them, else its host
// bits uploaded into `upload` (which must live until the kernels reading them are queued).
const uint8_t* device_bits_of(const Mask& mask, DeviceArray<uint8_t>& upload);

// A host mask as a byte mask [rows·cols] on the device, and back: both cross the bus bit-packed (one
// eighth of the bytes), packed and unpacked by kernels on the device. The downloaded mask keeps its packed
// bits on the device as well (DeviceMaskBits), so that masking a weight with it uploads nothing.
DeviceArray<uint8_t> upload_mask(const Mask& mask);
Mask download_mask(const uint8_t* device_bytes, int64_t rows, int64_t cols);

// select_mask on device scores.
Mask select_mask_on_device(const float* scores, int64_t rows, int64_t cols, const MaskSpec& spec,
                           std::string_view matrix_name = "<unnamed>", const MatrixPart* part = nullptr);

}  // namespace symprune::cuda
