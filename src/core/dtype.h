#pragma once
// Storage dtypes of model files and exact conversions to/from fp32 (round to nearest even).
// Weights are computed with only in F32, F16 and BF16 (is_weight_dtype); the other safetensors dtypes are
// known by name and size so that tensors the model does not use (position_ids in I64, inv_freq in F64, ...)
// can be carried through as opaque bytes.
#include <cstdint>
#include <cstring>
#include <string_view>

namespace symprune {

// The first three are the weight dtypes (is_weight_dtype).
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI64,
  kU64,
  kI32,
  kU32,
  kI16,
  kU16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
};

constexpr int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return 1;
  }
  return 1;
}
// The dtypes symprune reads weights in (convert_to_f32 / convert_from_f32 accept only these).
constexpr bool is_weight_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "F16", "BF16", "I64", ...
// Parses a safetensors dtype string (any byte-sized dtype of the format); false for anything else.
bool parse_dtype(std::string_view name, DType& out);
// Hugging Face torch_dtype spelling ("float32", "float16", "bfloat16"); weight dtypes only.
std::string_view torch_dtype_name(DType dtype);

inline float bits_to_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bf16_to_float(uint16_t bits) { return bits_to_float(static_cast<uint32_t>(bits) << 16); }
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = float_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);

// Converts `count` elements of weight dtype `dtype` at `src` (unaligned bytes, little-endian) to fp32.
void convert_to_f32(DType dtype, const void* src, float* dst, int64_t count);
// Converts fp32 to weight dtype `dtype` bytes (round to nearest even).
void convert_from_f32(DType dtype, const float* src, void* dst, int64_t count);

}  // namespace symprune
