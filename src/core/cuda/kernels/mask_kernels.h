#pragma once
// Host-only header: the mask-selection kernels on DEVICE pointers (core/cuda/device_memory.h), the
// primitives of MaskSelector (core/masks.h) for scores held on a GPU. Scores are row-major fp32
// [rows, cols]; masks are bytes (1 = pruned) in the same layout, as core::Mask holds them. The order is
// score_order_key's, ties by the lower column, exactly as on the CPU. Launches are asynchronous on
// `stream`; results written to device memory are read after a copy to the host (which synchronizes).
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// *first = the smallest flat index of a NaN score (unchanged when there is none; set it to INT64_MAX first).
void launch_first_nan(const float* scores, int64_t count, int64_t* first, DeviceStream stream);
// Per row, prunes the k smallest (key, column): 0 < k < cols.
void launch_select_rows(const float* scores, int64_t rows, int64_t cols, int64_t k, uint8_t* mask,
                        DeviceStream stream);
// Per group of m consecutive columns, prunes the n smallest (key, index in group); cols % m == 0.
void launch_select_nm(const float* scores, int64_t rows, int64_t cols, int n, int m, uint8_t* mask,
                      DeviceStream stream);
// hist[b] (bins = 2^bits counters, zeroed here) += scores with (key & prefix_mask) == prefix and
// (key >> shift) & (bins - 1) == b.
void launch_key_histogram(const float* scores, int64_t count, uint32_t prefix, uint32_t prefix_mask,
                          int shift, int bits, int64_t* hist, DeviceStream stream);
// mask = key < threshold_key; equal_in_row[r] = keys of row r equal to threshold_key.
void launch_prune_below_key(const float* scores, int64_t rows, int64_t cols, uint32_t threshold_key,
                            uint8_t* mask, int64_t* equal_in_row, DeviceStream stream);
// Also prunes the first quota[r] columns of row r whose key equals threshold_key.
void launch_prune_first_equal(const float* scores, int64_t rows, int64_t cols, uint32_t threshold_key,
                              const int64_t* quota, uint8_t* mask, DeviceStream stream);
// mask = score <= theta (NaN: 0).
void launch_prune_at_most(const float* scores, int64_t count, float theta, uint8_t* mask,
                          DeviceStream stream);
// bits[i / 8] bit (i % 8) = mask[i] (core::Mask::pack_bits' layout), ceil(count / 8) bytes.
void launch_pack_mask_bits(const uint8_t* mask, int64_t count, uint8_t* bits, DeviceStream stream);
// mask[i] = bit i of `bits` (the inverse of launch_pack_mask_bits), count bytes.
void launch_unpack_mask_bits(const uint8_t* bits, int64_t count, uint8_t* mask, DeviceStream stream);
// out[i] = weight[i] where bit i of `bits` (pack_bits' layout, 1 = pruned) equals keep_pruned, else 0:
// W̃ for keep_pruned = false, W − W̃ for true. out may be weight. Elements of element_bytes 4 (fp32) or 2
// (bf16/fp16).
void launch_mask_weight(const void* weight, int64_t element_bytes, const uint8_t* bits, int64_t count,
                        bool keep_pruned, void* out, DeviceStream stream);

}  // namespace symprune::cuda
