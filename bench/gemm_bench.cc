// The linear layer y = x Wᵀ on the CPU backend (OpenBLAS sgemm) at LLaMA-7B projection shapes with
// 512 tokens: q/k/v/o (4096 → 4096) and gate/up (4096 → 11008). Reports FLOP/s, for comparison with
// the CUDA backend when it lands (DESIGN.md §8).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>

#include "core/backend.h"
#include "core/tensor.h"

namespace symprune {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& v : t.values()) v = dist(rng);
  return t;
}

// Arguments: tokens, in, out, bias (0/1).
void BM_CpuLinear(benchmark::State& state) {
  const int64_t tokens = state.range(0), in = state.range(1), out = state.range(2);
  const Tensor x = random_tensor({tokens, in}, 1);
  const Tensor w = random_tensor({out, in}, 2);
  const Tensor b = random_tensor({out}, 3);
  const Tensor* bias = state.range(3) != 0 ? &b : nullptr;
  Tensor y;
  Backend& backend = cpu_backend();
  for (auto _ : state) {
    backend.linear(x, w, bias, y);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(tokens) * in * out,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = cpu_threads();
}

BENCHMARK(BM_CpuLinear)
    ->ArgNames({"tokens", "in", "out", "bias"})
    ->Args({512, 4096, 4096, 0})
    ->Args({512, 4096, 11008, 0})
    ->Args({512, 4096, 4096, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace symprune

BENCHMARK_MAIN();
