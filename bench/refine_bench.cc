// Mask refinement (DSnoT, R²-DSnoT) against the initial score + mask it refines, at LLaMA-7B matrix
// shapes (4096×4096 attention, 11008×4096 gate/up). Synthetic seeded data: W ~ N(0, 0.02²), activation
// statistics of N = 128 windows × T = 2048 tokens with per-channel means and scales drawn at random, so
// that e_r, the regrow keys and the Wanda order look like a real layer's (most rows stop by the threshold
// or the sign tests well before 50 cycles only if their error is small; the rest run all cycles).
// Real time, all threads (OpenMP over rows).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "core/activation_stats.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/scores.h"
#include "core/tensor.h"

namespace symprune {
namespace {

constexpr int64_t kSeqs = 128, kSeqLen = 2048;

struct Layer {
  Tensor w;
  ActivationStats stats;
  std::vector<double> mu, var, act;
};

Layer make_layer(int64_t rows, int64_t cols) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::lognormal_distribution<double> scale(0.0, 0.7);
  Layer l{Tensor({rows, cols}), {}, {}, {}, {}};
  for (auto& v : l.w.values()) v = 0.02f * normal(rng);
  const double tokens = static_cast<double>(kSeqs * kSeqLen);
  l.stats.n_seqs = kSeqs;
  l.stats.seq_len = kSeqLen;
  for (int64_t c = 0; c < cols; ++c) {
    const double sigma = scale(rng), mean = 0.3 * sigma * normal(rng);
    // Σx² = tokens·(σ² + mean²); Σx = tokens·mean; Σ_s(Σ_t x)² ≈ N·(T·mean)² + N·T·σ².
    l.stats.in_sumsq.push_back(tokens * (sigma * sigma + mean * mean));
    l.stats.in_sum.push_back(tokens * mean);
    l.stats.in_seqsq.push_back(kSeqs * (kSeqLen * mean) * (kSeqLen * mean) + tokens * sigma * sigma);
  }
  for (int64_t c = 0; c < cols; ++c) {
    l.mu.push_back(l.stats.input_mean_sum(c));
    l.var.push_back(l.stats.input_variance(c));
    l.act.push_back(l.stats.input_norm(c));
  }
  return l;
}

const Layer& layer_for(int64_t rows, int64_t cols) {
  static Layer square = make_layer(4096, 4096), tall = make_layer(11008, 4096);
  return rows == 4096 ? square : tall;
}

MaskSpec spec_for(int64_t mode) {
  return mode == 0 ? MaskSpec::row(0.6) : MaskSpec::nm(2, 4);
}

// Arguments: rows, cols, mask (0 row 60 %, 1 2:4). The baseline: Wanda score + mask selection.
void BM_WandaScoreMask(benchmark::State& state) {
  const Layer& l = layer_for(state.range(0), state.range(1));
  const MaskSpec spec = spec_for(state.range(2));
  ScoreOptions options;
  options.matrix_name = "bench";
  for (auto _ : state) {
    const Tensor scores = compute_scores(ScoreMethod::kWanda, l.w, &l.stats, options);
    Mask mask = select_mask(scores, spec, "bench");
    benchmark::DoNotOptimize(mask.flat().data());
  }
  state.SetLabel(describe(spec));
}

// Arguments: rows, cols, mask, variant (0 dsnot, 1 r2dsnot default, 2 r2dsnot γ₁ = γ₂ = 1e-3 p = 2).
// Times the refinement alone (the initial mask is copied in outside the timed region).
void BM_Refine(benchmark::State& state) {
  const Layer& l = layer_for(state.range(0), state.range(1));
  const MaskSpec spec = spec_for(state.range(2));
  ScoreOptions score_options;
  score_options.matrix_name = "bench";
  const Mask initial =
      select_mask(compute_scores(ScoreMethod::kWanda, l.w, &l.stats, score_options), spec, "bench");
  std::optional<NmPattern> nm;
  if (spec.kind == MaskSpec::kNM) nm = NmPattern{spec.n, spec.m};
  DsnotOptions options;
  const char* names[] = {"dsnot", "r2dsnot", "r2dsnot gammas"};
  if (state.range(3) >= 1) options.r2 = R2Options{};
  if (state.range(3) == 2) options.r2->gamma_grow = options.r2->gamma_prune = 1e-3;
  int64_t swaps = 0;
  double before = 0, after = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Mask mask = initial;
    state.ResumeTiming();
    const RefineStats s = refine_dsnot(l.w, l.mu, l.var, l.act, mask, options, nm);
    swaps = s.swaps;
    before = s.mean_abs_error_before;
    after = s.mean_abs_error_after;
    benchmark::DoNotOptimize(mask.flat().data());
  }
  state.SetLabel(std::string(names[state.range(3)]) + " " + describe(spec));
  state.counters["swaps_per_row"] = static_cast<double>(swaps) / static_cast<double>(state.range(0));
  state.counters["mean_abs_e_before"] = before;
  state.counters["mean_abs_e_after"] = after;
}

BENCHMARK(BM_WandaScoreMask)
    ->ArgsProduct({{4096}, {4096}, {0, 1}})
    ->ArgsProduct({{11008}, {4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Refine)
    ->ArgsProduct({{4096}, {4096}, {0, 1}, {0, 1, 2}})
    ->ArgsProduct({{11008}, {4096}, {0, 1}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace symprune

BENCHMARK_MAIN();
