#include "core/dtype.h"

#include <cmath>
#include <utility>

#include "core/error.h"

namespace symprune {
namespace {

// safetensors spellings, in DType order.
constexpr std::pair<DType, std::string_view> kDtypeNames[] = {
    {DType::kF32, "F32"},        {DType::kF16, "F16"},        {DType::kBF16, "BF16"},
    {DType::kF64, "F64"},        {DType::kI64, "I64"},        {DType::kU64, "U64"},
    {DType::kI32, "I32"},        {DType::kU32, "U32"},        {DType::kI16, "I16"},
    {DType::kU16, "U16"},        {DType::kI8, "I8"},          {DType::kU8, "U8"},
    {DType::kBool, "BOOL"},      {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E5M2, "F8_E5M2"},
    {DType::kF8E8M0, "F8_E8M0"},
};

}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const auto& [d, name] : kDtypeNames)
    if (d == dtype) return name;
  return "?";
}

std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    default:
      return "?";
  }
}

bool parse_dtype(std::string_view name, DType& out) {
  for (const auto& [d, spelling] : kDtypeNames) {
    if (spelling == name) {
      out = d;
      return true;
    }
  }
  return false;
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520 -> inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal or zero: round |value| * 2^24 to the nearest integer, ties to even.
    const float scaled = bits_to_float(abs_bits) * 16777216.0f;  // exact: power-of-two scaling
    const float rounded = std::nearbyint(scaled);                 // default rounding: nearest even
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even.
  uint32_t result = abs_bits - (112u << 23);
  result += 0xfffu + ((result >> 13) & 1u);
  return sign | static_cast<uint16_t>(result >> 13);
}

void convert_to_f32(DType dtype, const void* src, float* dst, int64_t count) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = fp16_to_float(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      return;
    default:
      SYMPRUNE_ASSERT(false, "convert_to_f32: {} is not a weight dtype", dtype_name(dtype));
  }
}

void convert_from_f32(DType dtype, const float* src, void* dst, int64_t count) {
  auto* bytes = static_cast<unsigned char*>(dst);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t h = float_to_fp16(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t h = float_to_bf16(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    default:
      SYMPRUNE_ASSERT(false, "convert_from_f32: {} is not a weight dtype", dtype_name(dtype));
  }
}

}  // namespace symprune
