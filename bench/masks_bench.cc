// Mask selection at LLaMA-7B matrix shapes: row (nth_element per row), layer (3-pass radix select)
// and 2:4. Selection is O(rows*cols); reports entries per second.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>

#include "core/masks.h"
#include "core/tensor.h"

namespace symprune {
namespace {

Tensor random_scores(int64_t rows, int64_t cols) {
  Tensor t({rows, cols});
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : t.values()) v = dist(rng);
  return t;
}

// Arguments: rows, cols, mode (0 row 50%, 1 layer 50%, 2 layer 50% compat <=, 3 2:4).
void BM_SelectMask(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const Tensor scores = random_scores(rows, cols);
  const MaskSpec specs[] = {MaskSpec::row(0.5), MaskSpec::layer(0.5), MaskSpec::layer(0.5, true),
                            MaskSpec::nm(2, 4)};
  const MaskSpec& spec = specs[state.range(2)];
  for (auto _ : state) {
    Mask mask = select_mask(scores, spec, "bench");
    benchmark::DoNotOptimize(mask.flat().data());
  }
  state.SetLabel(describe(spec));
  state.counters["entries/s"] =
      benchmark::Counter(static_cast<double>(rows * cols), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_SelectMask)
    ->ArgsProduct({{4096}, {4096}, {0, 1, 2, 3}})
    ->ArgsProduct({{11008}, {4096}, {0, 1, 3}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace symprune

BENCHMARK_MAIN();
