#pragma once
// Host-only header: the kernel of the 16-bit attention (device_attention.h) on DEVICE pointers.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace symprune::cuda {

// The causal softmax of a tile of queries: scores is [heads][tile][keys] fp32 (already scaled), the query
// at tile row i sees keys [0, first_query + i] (first_query + tile <= keys); probs (same layout, bf16 or
// fp16 = dtype) = softmax over the visible keys in fp32, rounded to dtype, 0 for the keys it cannot see.
void launch_causal_softmax_16bit(const float* scores, int64_t heads, int64_t tile, int64_t keys,
                                 int64_t first_query, DType dtype, void* probs, DeviceStream stream);

}  // namespace symprune::cuda
