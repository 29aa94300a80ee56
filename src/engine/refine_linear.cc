// One linear's refinement (refine_linear.h): method dispatch, the guard and the report's fields.
#include "engine/refine_linear.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "engine/prune_pipeline.h"

namespace symprune::engine {
namespace {

struct RefineInputs {
  std::vector<double> mu, var, act_norm;
};

RefineInputs refine_inputs(const ActivationStats& stats) {
  const int64_t n = stats.in_features();
  RefineInputs in;
  in.mu.resize(static_cast<size_t>(n));
  in.var.resize(static_cast<size_t>(n));
  in.act_norm.resize(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    in.mu[static_cast<size_t>(c)] = stats.input_mean_sum(c);
    in.var[static_cast<size_t>(c)] = stats.input_variance(c);
    in.act_norm[static_cast<size_t>(c)] = stats.input_norm(c);
  }
  return in;
}

}  // namespace

RefineSettings resolve_refine_settings(const PruneConfig& c) {
  SYMPRUNE_CHECK(c.refine == "none" || c.refine == "dsnot" || c.refine == "r2dsnot" || c.refine == "recon",
                 "--refine must be none, dsnot, r2dsnot or recon, got '{}'", c.refine);
  SYMPRUNE_CHECK(c.refine_skip == "mlp" || c.refine_skip == "attn" || c.refine_skip == "none",
                 "--refine-skip must be mlp, attn or none, got '{}'", c.refine_skip);
  SYMPRUNE_CHECK(
      !c.refine_guard || c.refine != "none",
      "--refine-guard keeps a refined row only if its error did not rise, so it needs a refinement: "
      "give --refine dsnot, r2dsnot or recon");
  RefineSettings s;
  s.method = c.refine;
  s.skip = c.refine_skip;
  s.guard = c.refine_guard;
  s.dsnot = c.refine_options;
  s.dsnot.nm_prune_any_sign = c.compat == "dsnot";  // the DSnoT code's N:M prune pick
  s.dsnot.r2.reset();
  if (c.refine == "r2dsnot") s.dsnot.r2 = c.r2;
  validate_dsnot_options(s.dsnot);
  s.recon.max_cycles = c.refine_options.max_cycles;
  validate_recon_options(s.recon);
  return s;
}

nlohmann::json refine_config_json(const RefineSettings& s, bool nm) {
  if (!s.enabled()) return nullptr;
  nlohmann::json j = {
      {"method", s.method}, {"skip", s.skip}, {"max_cycles", s.dsnot.max_cycles}, {"guard", s.guard}};
  if (s.method == "recon") {
    j["pool"] = s.recon.pool;
    j["shortlist"] = s.recon.shortlist;
    return j;
  }
  j["threshold"] = s.dsnot.threshold;
  j["var_power"] = s.dsnot.var_power;
  j["same_sign"] = s.dsnot.same_sign;
  // Which N:M prune pick: part of the run's identity, so that a checkpoint of a build with the other rule
  // (or the other --compat) is not continued.
  if (nm)
    j["nm_prune"] = s.dsnot.nm_prune_any_sign ? "smallest score (DSnoT code)"
                                              : "towards zero, else the next regrow candidate";
  if (const auto& r2 = s.dsnot.r2) {
    j["grow_relative"] = r2->grow_relative;
    j["prune_relative"] = r2->prune_relative;
    j["reg_p"] = std::isinf(r2->reg_p) ? nlohmann::json("inf") : nlohmann::json(r2->reg_p);
    j["gamma_grow"] = r2->gamma_grow;
    j["gamma_prune"] = r2->gamma_prune;
    j["alpha"] = r2->alpha;
  }
  return j;
}

RefineStats refine_linear(Backend& backend, const RefineSettings& s, const Tensor& weight,
                          const ActivationStats& stats, const double* gram, int64_t n, Mask& mask,
                          std::optional<NmPattern> nm, const std::vector<double>* column_l1) {
  SYMPRUNE_ASSERT(s.enabled(), "refine_linear called without a refinement method");
  const RefineInputs in = refine_inputs(stats);
  SYMPRUNE_ASSERT(gram != nullptr || (s.method != "recon" && !s.guard), "{} needs the Gram matrix",
                  s.guard ? "--refine-guard" : "--refine recon");
  // recon and the guard read the weight on the host (core/refine_recon.h); DSnoT runs on the backend.
  Tensor host_copy;
  // The host refinements read the mask row by row from many threads: a packed mask (from a device) is
  // unpacked here once, in parallel, rather than by the first of those threads alone.
  if (s.method == "recon") {
    const Tensor& w = backend.host_view(weight, host_copy);
    mask.unpack();
    const Mask initial = mask;
    RefineStats result = refine_recon(w, gram, n, mask, s.recon, nm);
    result.row_abs_error_before = abs_expected_errors(w, in.mu, initial);
    result.row_abs_error_after = abs_expected_errors(w, in.mu, mask);
    result.mean_abs_error_before = mean_of_rows(result.row_abs_error_before);
    result.mean_abs_error_after = mean_of_rows(result.row_abs_error_after);
    return result;
  }
  const Mask initial = s.guard ? mask : Mask();
  std::vector<double> prune_factor = in.act_norm;  // the prune key is |W| times this (core/refine_dsnot.h)
  if (nm && !s.dsnot.r2 && s.nm_prune_alpha) {
    const double alpha = *s.nm_prune_alpha;  // a_c^α as the scores compute it (core/scores.cc)
    for (double& a : prune_factor) a = alpha == 0.0 ? 1.0 : alpha == 1.0 ? a : std::pow(a, alpha);
  }
  RefineStats result =
      backend.refine_dsnot(weight, in.mu, in.var, prune_factor, mask, s.dsnot, nm, column_l1);
  if (!s.guard) return result;
  const Tensor& w = backend.host_view(weight, host_copy);
  initial.unpack();
  mask.unpack();
  std::vector<double> changes = recon_row_changes(w, gram, n, initial, mask);
  result.rows_reverted = revert_rows_that_rose(initial, mask, changes);
  result.recon_sq_change = sum_of_rows(changes);
  result.row_recon_sq_change = std::move(changes);
  if (result.rows_reverted > 0) {
    result.row_abs_error_after = abs_expected_errors(w, in.mu, mask);
    result.mean_abs_error_after = mean_of_rows(result.row_abs_error_after);
  }
  return result;
}

}  // namespace symprune::engine
