#pragma once
// CPython's `random` module generator (Mersenne Twister MT19937 with CPython's seeding and derived
// draws), reproduced bit for bit so calibration windows equal those of the reference Python loaders
// (reference-implementations.md §1.2). Note `random.seed(0)` seeds via init_by_array([0]); it is NOT
// std::mt19937(0).
#include <array>
#include <cstdint>

namespace symprune::io {

class PythonRandom {
 public:
  // As `random.seed(seed)` for a non-negative int: init_by_array over the 32-bit words of the seed,
  // least significant first (seed 0 -> key [0]; seeds below 2^32 -> one word).
  explicit PythonRandom(uint64_t seed = 0) { seed_int(seed); }
  void seed_int(uint64_t seed);

  // genrand_uint32: the next raw 32-bit output.
  uint32_t next_u32();
  // `random.getrandbits(k)` for 0 <= k <= 64 (k > 32 fills 32-bit words least significant first and
  // drops the low bits of the last word, as CPython does).
  uint64_t getrandbits(int k);
  // `random._randbelow(n)` for n >= 1: rejection sampling on getrandbits(bit_length(n)).
  uint64_t randbelow(uint64_t n);
  // `random.randint(a, b)` = a + randbelow(b - a + 1); requires a <= b and b - a < 2^64 - 1.
  int64_t randint(int64_t a, int64_t b);
  // `random.random()`: 53-bit double in [0, 1).
  double random();

 private:
  void init_genrand(uint32_t s);
  void init_by_array(const uint32_t* key, int length);

  static constexpr int kN = 624;
  std::array<uint32_t, kN> state_{};
  int index_ = kN + 1;
};

}  // namespace symprune::io
