#pragma once

// The two hashes symprune's identities are built from. Their values are stored (checkpoint fingerprints,
// token fingerprints) or generate data (synthetic weights, stochRIA's samples), so they must never change.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace symprune {

// 64-bit FNV-1a, fed incrementally.
class Fnv1a64 {
 public:
  void update(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      hash_ ^= bytes[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  void update(std::string_view text) { update(text.data(), text.size()); }
  // The low `bytes` (at most 8) bytes of `value`, least significant first (the digest does not depend on the
  // host's byte order).
  void update_little_endian(uint64_t value, int bytes) {
    unsigned char le[8];
    for (int i = 0; i < bytes; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
    update(le, static_cast<size_t>(bytes));
  }
  uint64_t digest() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

inline uint64_t fnv1a64(std::string_view text) {
  Fnv1a64 hash;
  hash.update(text);
  return hash.digest();
}

// SplitMix64's output function: a bijective mix of 64 bits.
inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace symprune
