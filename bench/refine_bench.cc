// Mask refinement (DSnoT, R²-DSnoT, recon) against the initial score + mask it refines, at LLaMA-7B
// matrix shapes (4096×4096 attention, 11008×4096 gate/up). Synthetic seeded data: W ~ N(0, 0.02²), activation
// statistics of N = 128 windows × T = 2048 tokens with per-channel means and scales drawn at random, so
// that e_r, the regrow keys and the Wanda order look like a real layer's (most rows stop by the threshold
// or the sign tests well before 50 cycles only if their error is small; the rest run all cycles).
// recon needs the Gram matrix G = XᵀX: X is 1024 seeded token rows x_t = s ∘ (μ + F z_t + ε_t) with the
// same per-channel scales s and means μ as the statistics, 8 shared factors F (correlated channels, as in
// real layers) and unit noise ε; XᵀX is one sgemm of the CPU backend, summed in fp64, plus a ridge
// 1024·s_c² on the diagonal so that G has full rank (the noise of the tokens not drawn). Only G's size and
// conditioning matter for the time; its structure sets how far recon lowers the error. Counters at
// 4096×4096: rel_err_before/after, the pipeline's ‖(W − W̃)X‖/‖WX‖ of the initial and the refined mask on
// that G (computed outside the timed loop). Real time, all threads (OpenMP over rows).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/refine_recon.h"
#include "core/scores.h"
#include "core/tensor.h"

namespace symprune {
namespace {

constexpr int64_t kSeqs = 128, kSeqLen = 2048;

constexpr int64_t kGramTokens = 1024, kGramFactors = 8;

struct Layer {
  Tensor w;
  ActivationStats stats;
  std::vector<double> mu, var, act;
  std::vector<double> sigma, mean;  // per channel, for the Gram matrix
};

Layer make_layer(int64_t rows, int64_t cols) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::lognormal_distribution<double> scale(0.0, 0.7);
  Layer l{Tensor({rows, cols}), {}, {}, {}, {}, {}, {}};
  for (auto& v : l.w.values()) v = 0.02f * normal(rng);
  const double tokens = static_cast<double>(kSeqs * kSeqLen);
  l.stats.n_seqs = kSeqs;
  l.stats.seq_len = kSeqLen;
  for (int64_t c = 0; c < cols; ++c) {
    const double sigma = scale(rng), mean = 0.3 * sigma * normal(rng);
    l.sigma.push_back(sigma);
    l.mean.push_back(mean / sigma);
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

// G = XᵀX (+ ridge) for the layer's channels; see the header. Both shapes have 4096 inputs and the same
// channel draws, so one G serves both.
const std::vector<double>& gram_for(const Layer& l) {
  static const std::vector<double> gram = [&] {
    const auto n = static_cast<int64_t>(l.sigma.size());
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor factors({kGramFactors, n});
    for (auto& v : factors.values()) v = 0.5f * normal(rng);
    Tensor xt({n, kGramTokens});  // Xᵀ
    std::vector<float> z(kGramFactors);
    for (int64_t t = 0; t < kGramTokens; ++t) {
      for (auto& v : z) v = normal(rng);
      for (int64_t c = 0; c < n; ++c) {
        double x = l.mean[static_cast<size_t>(c)] + normal(rng);
        for (int64_t k = 0; k < kGramFactors; ++k) x += factors[k * n + c] * z[static_cast<size_t>(k)];
        xt[c * kGramTokens + t] = static_cast<float>(l.sigma[static_cast<size_t>(c)] * x);
      }
    }
    Tensor product;
    cpu_backend().linear(xt, xt, nullptr, product);  // Xᵀ·X
    std::vector<double> g(product.values().begin(), product.values().end());
    for (int64_t c = 0; c < n; ++c)
      g[static_cast<size_t>(c * n + c)] +=
          kGramTokens * l.sigma[static_cast<size_t>(c)] * l.sigma[static_cast<size_t>(c)];
    return g;
  }();
  return gram;
}

MaskSpec spec_for(int64_t mode) {
  return mode == 0 ? MaskSpec::row(0.6) : MaskSpec::nm(2, 4);
}

// ‖ΔW X‖² = Σ_r Δw_r G Δw_rᵀ of a mask (fp32 product ΔW·G, summed in fp64), and ‖WX‖², for the counters
// rel_err_before/after = ‖(W − W̃)X‖/‖WX‖ (the pipeline's recon_error); after = before + the exact change.
double recon_sq(const Tensor& w, const std::vector<double>& gram, const Mask* mask) {
  const int64_t n = w.dim(1);
  Tensor g({n, n}), delta = w, product;
  for (int64_t i = 0; i < n * n; ++i) g[i] = static_cast<float>(gram[static_cast<size_t>(i)]);
  if (mask != nullptr)
    for (int64_t i = 0; i < w.numel(); ++i) delta[i] = mask->flat()[static_cast<size_t>(i)] ? w[i] : 0.0f;
  cpu_backend().linear(delta, g, nullptr, product);
  double sum = 0.0;
  for (int64_t i = 0; i < w.numel(); ++i) sum += static_cast<double>(delta[i]) * product[i];
  return sum;
}

void set_error_counters(benchmark::State& state, const Layer& l, const Mask& initial, const Mask& refined) {
  if (state.range(0) != 4096) return;  // the 11008-row products would add minutes of setup
  const std::vector<double>& gram = gram_for(l);
  static const double dense = recon_sq(l.w, gram, nullptr);
  static std::map<int64_t, double> before_of_mask;  // per mask kind: every benchmark starts from it
  auto it = before_of_mask.find(state.range(2));
  if (it == before_of_mask.end())
    it = before_of_mask.emplace(state.range(2), recon_sq(l.w, gram, &initial)).first;
  const double before = it->second;
  double change = 0.0;
  for (double c : recon_row_changes(l.w, gram.data(), l.w.dim(1), initial, refined)) change += c;
  state.counters["rel_err_before"] = std::sqrt(before / dense);
  state.counters["rel_err_after"] = std::sqrt((before + change) / dense);
}

// The initial mask every refinement starts from.
Mask wanda_mask(const Layer& l, const MaskSpec& spec) {
  ScoreOptions options;
  options.matrix_name = "bench";
  return select_mask(compute_scores(ScoreMethod::kWanda, l.w, &l.stats, options), spec, "bench");
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
  const Mask initial = wanda_mask(l, spec);
  std::optional<NmPattern> nm;
  if (spec.kind == MaskSpec::kNM) nm = NmPattern{spec.n, spec.m};
  DsnotOptions options;
  const char* names[] = {"dsnot", "r2dsnot", "r2dsnot gammas"};
  if (state.range(3) >= 1) options.r2 = R2Options{};
  if (state.range(3) == 2) options.r2->gamma_grow = options.r2->gamma_prune = 1e-3;
  int64_t swaps = 0;
  double before = 0, after = 0;
  Mask mask;
  for (auto _ : state) {
    state.PauseTiming();
    mask = initial;
    state.ResumeTiming();
    const RefineStats s = refine_dsnot(l.w, l.mu, l.var, l.act, mask, options, nm);
    swaps = s.swaps;
    before = s.mean_abs_error_before;
    after = s.mean_abs_error_after;
    benchmark::DoNotOptimize(mask.flat().data());
  }
  set_error_counters(state, l, initial, mask);
  state.SetLabel(std::string(names[state.range(3)]) + " " + describe(spec));
  state.counters["swaps_per_row"] = static_cast<double>(swaps) / static_cast<double>(state.range(0));
  state.counters["mean_abs_e_before"] = before;
  state.counters["mean_abs_e_after"] = after;
}

// Arguments: rows, cols, mask, pool (ReconOptions::pool; the default is 96). recon from the same initial
// mask.
void BM_Recon(benchmark::State& state) {
  const Layer& l = layer_for(state.range(0), state.range(1));
  const std::vector<double>& gram = gram_for(l);
  const MaskSpec spec = spec_for(state.range(2));
  const Mask initial = wanda_mask(l, spec);
  std::optional<NmPattern> nm;
  if (spec.kind == MaskSpec::kNM) nm = NmPattern{spec.n, spec.m};
  ReconOptions options;
  options.pool = static_cast<int>(state.range(3));
  RefineStats stats;
  Mask mask;
  for (auto _ : state) {
    state.PauseTiming();
    mask = initial;
    state.ResumeTiming();
    stats = refine_recon(l.w, gram.data(), state.range(1), mask, options, nm);
    benchmark::DoNotOptimize(mask.flat().data());
  }
  state.SetLabel("recon pool " + std::to_string(options.pool) + " " + describe(spec));
  state.counters["swaps_per_row"] = static_cast<double>(stats.swaps) / static_cast<double>(state.range(0));
  set_error_counters(state, l, initial, mask);
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
BENCHMARK(BM_Recon)
    ->ArgsProduct({{4096}, {4096}, {0, 1}, {64, 96, 128}})
    ->ArgsProduct({{11008}, {4096}, {0, 1}, {96}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace symprune

BENCHMARK_MAIN();
