// compute_scores on device weights (see device_scores.h).
#include "core/cuda/kernels/device_scores.h"

#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cuda/kernels/score_kernels.h"
#include "core/error.h"

namespace symprune::cuda {
namespace {

std::string label(const ScoreOptions& options) {
  return options.matrix_name.empty() ? std::string("<unnamed matrix>") : options.matrix_name;
}

const Tensor& need_host_weight(const Tensor* host_weight, std::string_view what,
                               const ScoreOptions& options) {
  SYMPRUNE_CHECK(host_weight != nullptr,
                 "{}: {} on the GPU reads the weight's host copy, which was not given", label(options), what);
  return *host_weight;
}

class DeviceWeightReductions final : public WeightReductions {
 public:
  DeviceWeightReductions(const float* weight, int64_t m, int64_t n) : weight_(weight), m_(m), n_(n) {}

  std::vector<double> row_norms(double p) override {
    DeviceArray<double> sums(m_);
    launch_row_norm_sums(weight_, m_, n_, p, sums.data(), {});
    return finished(sums.download(), p);
  }
  std::vector<double> column_norms(double p) override {
    DeviceArray<double> sums(n_);
    launch_column_norm_sums(weight_, m_, n_, p, sums.data(), {});
    return finished(sums.download(), p);
  }
  // The CPU's sampler draws the indices (no weight needed); the sums over them run where W is, so only
  // (m + n)·τ 32-bit indices cross the bus (a tenth of W's bytes at the default β = 0.1), in uploads of at
  // most kDeviceRefineScratchBytes (the plan's scratch allowance: scoring and DSnoT never hold it at once).
  void stochria_sums(const ScoreOptions& options, std::vector<double>& row_sums,
                     std::vector<double>& column_sums) override {
    const int64_t tau = stochria_tau(options.beta, m_, n_);
    for (const bool columns : {false, true}) {
      DeviceArray<double> sums(columns ? n_ : m_);
      visit_stochria_samples(options, m_, n_, columns, kDeviceRefineScratchBytes,
                             [&](int64_t begin, int64_t end, std::span<const int32_t> picks) {
                               const DeviceArray<int32_t> device_picks(picks.data(),
                                                                       static_cast<int64_t>(picks.size()));
                               launch_sampled_abs_sums(weight_, n_, device_picks.data(), begin, end, tau,
                                                       columns, sums.data(), {});
                             });
      (columns ? column_sums : row_sums) = sums.download();
    }
  }

 private:
  static std::vector<double> finished(std::vector<double> sums, double p) {
    for (double& value : sums) value = norm_finish(p, value);
    return sums;
  }

  const float* weight_;
  int64_t m_, n_;
};

}  // namespace

void compute_scores_on_device(ScoreMethod method, const float* weight, int64_t m, int64_t n,
                              const Tensor* host_weight, const ActivationStats* stats,
                              const ScoreOptions& options, float* scores) {
  validate_score_options(method, options);
  SYMPRUNE_CHECK(m > 0 && n > 0, "{}: scores need a non-empty weight, got shape [{}, {}]", label(options), m,
                 n);
  const int64_t row_begin = options.row_begin, row_end = options.row_end < 0 ? m : options.row_end;
  SYMPRUNE_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= m,
                 "{}: score rows [{}, {}) outside the {} rows of the weight", label(options), row_begin,
                 row_end, m);
  {
    const int64_t index =
        first_index_on_device([&](int64_t* first) { launch_first_nonfinite(weight, m * n, first, {}); });
    if (index >= 0) {
      float value = 0.0f;
      copy_to_host(&value, weight + index, sizeof value);
      fail_non_finite_weight(label(options), index, n, value);
    }
  }
  if (options.compat_ria_fp16 && (method == ScoreMethod::kRI || method == ScoreMethod::kRIA)) {
    const Tensor host_scores =
        compute_scores(method, need_host_weight(host_weight, "--compat ria", options), stats, options);
    copy_to_device(scores, host_scores.data(), static_cast<size_t>(host_scores.numel()) * sizeof(float), {});
    synchronize();
    return;
  }
  DeviceWeightReductions reductions(weight, m, n);
  const ScorePlan plan = plan_scores(method, m, n, stats, options, reductions);
  const DeviceArray<double> u(plan.row_term), v(plan.column_term), f(plan.column_factor);
  const int64_t saturated = first_index_on_device([&](int64_t* first) {
    launch_plan_scores(weight, n, row_begin, row_end, static_cast<int>(plan.form), u.data(), v.data(),
                       plan.column_factor.empty() ? nullptr : f.data(), scores, first, {});
  });  // waits for the scores: u, v, f are freed on return
  if (saturated >= 0) {
    float value = 0.0f;
    copy_to_host(&value, weight + saturated, sizeof value);
    fail_saturated_score(method, options, plan, saturated / n, saturated % n, value);
  }
}

}  // namespace symprune::cuda
