#pragma once
// Storage dtypes of model files and exact conversions to/from fp32 (round to nearest even).
#include <cstdint>
#include <cstring>
#include <string_view>

namespace symprune {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr int64_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "F16", "BF16"
// Parses a safetensors dtype string; returns false for anything else (I64, F64, U8, ...).
bool parse_dtype(std::string_view name, DType& out);
// Hugging Face torch_dtype spelling ("float32", "float16", "bfloat16").
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

// Converts `count` elements of `dtype` at `src` (unaligned bytes, little-endian) to fp32.
void convert_to_f32(DType dtype, const void* src, float* dst, int64_t count);
// Converts fp32 to `dtype` bytes (round to nearest even).
void convert_from_f32(DType dtype, const float* src, void* dst, int64_t count);

}  // namespace symprune
