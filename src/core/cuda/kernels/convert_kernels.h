#pragma once
// Host-only header: element dtype conversion on DEVICE pointers, for tensors stored in bf16/fp16 by a
// run in lower precision (--dtype). fp32 -> bf16/fp16 rounds to nearest even as core/dtype.h's
// convert_from_f32 does (the same bits, NaN payloads aside); bf16/fp16 -> fp32 is exact.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace symprune::cuda {

// dst[i] = src[i] for i < count, from src_dtype to dst_dtype (weight dtypes, core::is_weight_dtype, as
// every device tensor's; other dtypes do nothing); a copy when they are the same. src and dst must not
// overlap.
void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count,
                    DeviceStream stream);

}  // namespace symprune::cuda
