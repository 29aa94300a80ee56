#include "io/python_random.h"

#include "core/error.h"

namespace symprune::io {
namespace {

constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;

int bit_length(uint64_t n) {
  int k = 0;
  while (n) {
    ++k;
    n >>= 1;
  }
  return k;
}

}  // namespace

// The three functions below follow CPython's Modules/_randommodule.c (itself the reference mt19937ar.c).
void PythonRandom::init_genrand(uint32_t s) {
  state_[0] = s;
  for (int i = 1; i < kN; ++i)
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  index_ = kN;
}

void PythonRandom::init_by_array(const uint32_t* key, int length) {
  init_genrand(19650218u);
  int i = 1, j = 0;
  for (int k = (kN > length ? kN : length); k; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525u)) + key[j] +
                static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
    if (j >= length) j = 0;
  }
  for (int k = kN - 1; k; --k) {
    state_[i] =
        (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      state_[0] = state_[kN - 1];
      i = 1;
    }
  }
  state_[0] = 0x80000000u;  // MSB is 1, assuring a non-zero initial array
}

uint32_t PythonRandom::next_u32() {
  if (index_ >= kN) {
    int kk = 0;
    for (; kk < kN - kM; ++kk) {
      const uint32_t y = (state_[kk] & kUpperMask) | (state_[kk + 1] & kLowerMask);
      state_[kk] = state_[kk + kM] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
    }
    for (; kk < kN - 1; ++kk) {
      const uint32_t y = (state_[kk] & kUpperMask) | (state_[kk + 1] & kLowerMask);
      state_[kk] = state_[kk + (kM - kN)] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
    }
    const uint32_t y = (state_[kN - 1] & kUpperMask) | (state_[0] & kLowerMask);
    state_[kN - 1] = state_[kM - 1] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
    index_ = 0;
  }
  uint32_t y = state_[index_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

void PythonRandom::seed_int(uint64_t seed) {
  // CPython: key = the 32-bit words of abs(seed), least significant first; at least one word.
  uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  init_by_array(key, (seed >> 32) ? 2 : 1);
}

uint64_t PythonRandom::getrandbits(int k) {
  SYMPRUNE_ASSERT(k >= 0 && k <= 64, "getrandbits({}) supports 0..64 bits", k);
  if (k == 0) return 0;
  if (k <= 32) return next_u32() >> (32 - k);
  // CPython fills 32-bit words from least to most significant; the last word keeps its high bits.
  uint64_t result = 0;
  int shift = 0;
  for (int remaining = k; remaining > 0; remaining -= 32, shift += 32) {
    uint32_t r = next_u32();
    if (remaining < 32) r >>= (32 - remaining);
    result |= static_cast<uint64_t>(r) << shift;
  }
  return result;
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  SYMPRUNE_ASSERT(n >= 1, "randbelow needs n >= 1");
  const int k = bit_length(n);
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

int64_t PythonRandom::randint(int64_t a, int64_t b) {
  SYMPRUNE_ASSERT(a <= b, "randint({}, {}): empty range", a, b);
  const uint64_t width = static_cast<uint64_t>(b) - static_cast<uint64_t>(a) + 1;
  SYMPRUNE_ASSERT(width != 0, "randint range too wide");
  return static_cast<int64_t>(static_cast<uint64_t>(a) + randbelow(width));
}

double PythonRandom::random() {
  const uint32_t a = next_u32() >> 5;
  const uint32_t b = next_u32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

}  // namespace symprune::io
