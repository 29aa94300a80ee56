// symprune prune: the layer-wise pruning pipeline (DESIGN.md §3.5) on one process: calibration, per-block
// statistics, scores, masks, pruned passes, a pruned Hugging Face model out, a report.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "command.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/prune_pipeline.h"
#include "io/atomic_file.h"
#include "recipe_config.h"

namespace symprune::app {
namespace {

struct PruneCliOptions {
  engine::PruneConfig config;
  double alpha = 0.0;
  double sparsity = 0.0;
  std::string out;
  std::string report;
  CLI::Option* alpha_option = nullptr;
  CLI::Option* sparsity_option = nullptr;
};

constexpr const char* kMethodsHelp = R"(
Methods (W[r,c]: output row r, input column c; a_c = input activation norm, b_r = output norm;
a lower score is pruned first):
  magnitude     |W|                                   no calibration data needed
  wanda         |W| * a_c^alpha            (alpha 1)   Wanda
  owanda        |W| * b_r^alpha            (alpha 1)   output-side Wanda
  symwanda      |W| * (a_c^alpha + b_r^alpha)          symmetric Wanda (alpha 1)
  symwanda-sq   |W| * sqrt(a_c^2alpha + b_r^2alpha)    squared variant (alpha 1)
  symmetric     |W| * (||W[r,:]||2 + ||W[:,c]||2)      no calibration data needed
  symmetric-sq  |W| * sqrt(||W[r,:]||2^2 + ||W[:,c]||2^2)   no calibration data needed
  ri            |W|/||W[r,:]||1 + |W|/||W[:,c]||1      relative importance, no calibration data needed
  ria           ri * a_c^alpha             (alpha 0.5) RIA
  ria-row       |W|/||W[r,:]||1 * a_c^alpha            the paper's "Col-Sum" ablation (alpha 0.5)
  ria-col       |W|/||W[:,c]||1 * a_c^alpha            the paper's "Row-Sum" ablation (alpha 0.5)
  lp            lp-norm relative importance, --p in {0,1,2,3,4,inf}, --strategy S1..S4 (alpha 0.5);
                S1 |W|(1/R+1/C)  S2 |W|/(R+C)  S3 |W|(R+C)  S4 |W|/(1/R+1/C); p=1,S1 = ria
  stochria      ria with row/column sums over sampled subsets of tau = max(1, floor(beta*min(m,n)))
                entries (--beta, --method-seed; alpha 0.5)
Activation-aware methods (all with alpha, unless --alpha 0) need --calib; the others run no forward pass.

Masks: --sparsity R prunes exactly floor(n*R) weights per output row (--group row, default) or
floor(m*n*R) per matrix (--group layer); --nm N:M prunes N of every M consecutive inputs in each row.
--compat wanda: magnitude per layer with the reference "<= threshold" rule, other methods as asked
(--group layer uses "<= threshold"), and --seqlen defaults to max_position_embeddings. --compat ria: per layer "<= threshold" unless --group row, and
RIA's fp16 rounding of the relative-importance term for ri and ria.

Refinement (--refine, after the initial mask, before the pruned pass; only the mask changes):
  dsnot     DSnoT: per output row, swap one pruned and one kept weight per cycle to drive the expected
            error e_r = sum over pruned c of W[r,c]*mu_c towards 0 (mu_c: mean per-sequence input sum);
            regrow by W*mu/var^p (--var-power), prune by the Wanda score split by the sign of W*mu;
            a row stops for good when |e_r| <= --refine-threshold, after --max-cycles swaps, or (with
            --same-sign; always for N:M) when a swap would flip the sign of its error.
  r2dsnot   R2-DSnoT: DSnoT with the relative factor 1/||W~[r,:]||1 + 1/||W~[:,c]||1 in the regrow key
            (--grow-relative) and the prune key (--prune-relative), a_c^--refine-alpha in the prune key,
            and lp regularizers gamma*||row after the move||_p (--reg-p, --gamma-grow, --gamma-prune).
  recon     per output row, swap the pruned/kept pair that most lowers the row's exact reconstruction
            error E_r = dw G dw^T on the calibration inputs (G = X^T X, dw = the row's pruned weights),
            among the weights nearest the mask's saliency boundary; a row stops when no swap lowers E_r
            or after --max-cycles swaps, so no row ever gets worse. Reads --max-cycles only.
  --refine-guard (dsnot, r2dsnot): keep a refined row only if its E_r did not rise, else restore its
  initial mask (the report counts these rows); off by default, for parity with the DSnoT code. With
  recon it is accepted and changes nothing.
  --refine-skip mlp (default, as DSnoT) refines only the self_attn projections; attn only the MLP;
  none every linear. Refinement needs --calib, whatever the scoring method.

Output: a Hugging Face directory in the input's dtype and sharding; pruned weights exactly zero, every
other weight bit-identical; config and tokenizer files copied. stdout: per-layer table (sparsity and
relative reconstruction error ||(W-W~)X||/||WX|| on the dense calibration inputs), and with --eval
"perplexity.dense: X" / "perplexity.pruned: Y".
)";

void run_prune(PruneCliOptions& o) {
  engine::PruneConfig& c = o.config;
  if (o.alpha_option->count() > 0) c.alpha = o.alpha;
  if (o.sparsity_option->count() > 0) c.sparsity = o.sparsity;
  c.out = o.out;
  // The report is written last; a report path that cannot work must fail before hours of pruning, and a
  // report write that fails after all must not leave a new model directory behind.
  if (!o.report.empty()) io::check_output_file_directory(o.report);
  const bool out_existed = std::filesystem::exists(c.out);
  const auto result = engine::prune_model(c, [](const engine::BlockProgress& p) {
    log::info("block {}/{} done ({:.1f} s)", p.block + 1, p.blocks, p.seconds);
  });

  const bool refined = c.refine != "none";
  std::printf("%-28s %-14s %9s %12s", "layer", "shape", "sparsity", "recon_error");
  if (refined)
    std::printf(" %12s %8s %8s %21s", "recon_initial", "swaps", "reverted", "mean|e| before->after");
  std::printf("\n");
  for (const auto& l : result.layers) {
    const std::string shape = fmt::format("[{}, {}]", l.shape.at(0), l.shape.at(1));
    const std::string recon = l.recon_error ? fmt::format("{:.6f}", *l.recon_error) : "-";
    std::printf("%-28s %-14s %9.4f %12s", l.name.c_str(), shape.c_str(), l.sparsity, recon.c_str());
    if (refined && l.refine) {
      const std::string initial = l.recon_error_initial ? fmt::format("{:.6f}", *l.recon_error_initial) : "-";
      const std::string errors =
          fmt::format("{:.4g} -> {:.4g}", l.refine->mean_abs_error_before, l.refine->mean_abs_error_after);
      std::printf(" %12s %8lld %8lld %21s", initial.c_str(), static_cast<long long>(l.refine->swaps),
                  static_cast<long long>(l.refine->rows_reverted), errors.c_str());
    } else if (refined) {
      std::printf(" %12s %8s %8s %21s", "-", "skipped", "-", "-");
    }
    std::printf("\n");
  }
  std::printf("sparsity.total: %.6f (%lld of %lld weights, target %.4f, %s)\n", result.sparsity_total(),
              static_cast<long long>(result.pruned_total), static_cast<long long>(result.params_total),
              result.sparsity_target, result.mask_description.c_str());
  if (result.perplexity) {
    std::printf("perplexity.dense: %.6f\n", result.perplexity->dense);
    std::printf("perplexity.pruned: %.6f\n", result.perplexity->pruned);
  }
  if (!o.report.empty()) {
    try {
      io::write_file_atomically(o.report, result.report().dump(2) + "\n");
    } catch (const Error&) {
      std::error_code ignored;
      if (!out_existed) std::filesystem::remove_all(c.out, ignored);
      throw;
    }
    log::info("wrote {}", o.report);
  }
  std::printf("wrote %s (%.2f s)\n", c.out.string().c_str(), result.timings.total);
}

void add_prune(CLI::App& app) {
  auto o = std::make_shared<PruneCliOptions>();
  engine::PruneConfig& c = o->config;
  CLI::App* sub = app.add_subcommand("prune", "Prune a model layer by layer and write the pruned model");
  sub->add_option("--model", c.model, "model directory, short name (llama2-7b) or Hugging Face repo id")
      ->required();
  sub->add_option("--method", c.method,
                  "scoring method: magnitude wanda owanda symwanda symwanda-sq symmetric symmetric-sq ri ria "
                  "ria-row ria-col lp stochria (see below)")
      ->required();
  o->alpha_option = sub->add_option("--alpha", o->alpha,
                                    "activation exponent of activation-aware methods (default: 1 for the "
                                    "wanda family, 0.5 for ria, ria-row, ria-col, lp, stochria)");
  sub->add_option("--p", c.p, "lp: norm order 0 (nonzero count), 1, 2, 3, 4 or inf (default 1)");
  sub->add_option("--strategy", c.strategy, "lp: combination strategy S1..S4 (default 1)");
  sub->add_option("--beta", c.beta, "stochria: sampling ratio in (0, 1] (default 0.1)");
  sub->add_option("--method-seed", c.method_seed, "stochria: sampling seed (default 0)");
  o->sparsity_option =
      sub->add_option("--sparsity", o->sparsity, "unstructured sparsity R in [0, 1), e.g. 0.5");
  auto* group = sub->add_option("--group", c.group,
                                "unstructured comparison group: row (exactly floor(n*R) per output row, "
                                "default) or layer (floor(m*n*R) per matrix)");
  auto* nm = sub->add_option("--nm", c.nm, "semi-structured N:M pattern, e.g. 2:4 (instead of --sparsity)");
  o->sparsity_option->excludes(nm);
  nm->excludes(group);
  sub->add_option("--compat", c.compat,
                  "none (default), wanda or ria: reproduce that tool's mask rules (see below)");
  sub->add_option("--refine", c.refine,
                  "mask refinement: none (default), dsnot, r2dsnot or recon (see below)");
  sub->add_flag("--refine-guard", c.refine_guard,
                "refinement: restore a row's initial mask when refining raised its reconstruction error");
  sub->add_option("--refine-skip", c.refine_skip,
                  "linears left unrefined: mlp (default, as DSnoT), attn or none");
  sub->add_option("--max-cycles", c.refine_options.max_cycles,
                  "refinement: swaps per row at most (default 50)");
  sub->add_option("--refine-threshold", c.refine_options.threshold,
                  "refinement: a row stops when |e_r| <= this (default 0.1, in per-sequence-sum units)");
  sub->add_option("--var-power", c.refine_options.var_power,
                  "refinement: regrow key divides by var^this (default 1; 0 = no division)");
  sub->add_flag("--same-sign", c.refine_options.same_sign,
                "refinement: stop a row before a swap flips the sign of its error (always on for N:M)");
  sub->add_flag("--grow-relative,!--no-grow-relative", c.r2.grow_relative,
                "r2dsnot: relative factor in the regrow key (default on)");
  sub->add_flag("--prune-relative,!--no-prune-relative", c.r2.prune_relative,
                "r2dsnot: relative factor in the prune key (default on)");
  sub->add_option("--reg-p", c.r2.reg_p, "r2dsnot: regularizer norm 1, 2 or inf (default 2)");
  sub->add_option("--gamma-grow", c.r2.gamma_grow, "r2dsnot: regrow regularization weight (default 0)");
  sub->add_option("--gamma-prune", c.r2.gamma_prune, "r2dsnot: prune regularization weight (default 0)");
  sub->add_option("--refine-alpha", c.r2.alpha, "r2dsnot: prune key activation exponent (default 0.5)");
  sub->add_option("--calib", c.calib,
                  "calibration data: C4-style JSONL (.jsonl/.json, optionally .gz), plain text, or token "
                  "file (.bin); required by activation-aware methods");
  sub->add_option("--calib-format", c.calib_format,
                  "auto (by file name), jsonl, text, tokens-u16 or tokens-u32 (default auto)");
  sub->add_option("--nsamples", c.nsamples, "calibration windows (default 128)");
  sub->add_option(
      "--seqlen", c.seqlen,
      "tokens per calibration window (default 2048; with --compat wanda: max_position_embeddings)");
  sub->add_option("--seed", c.seed, "calibration sampling seed, Python random.seed semantics (default 0)");
  sub->add_option("--out", o->out, "output directory (Hugging Face layout); must not lie inside the input")
      ->required();
  sub->add_flag("--force", c.force, "replace an existing non-empty --out");
  sub->add_option("--eval", c.eval,
                  "text file: report perplexity of the dense and the pruned model (one BOS at its start, "
                  "chunks of --eval-seqlen tokens)");
  sub->add_option("--eval-seqlen", c.eval_seqlen, "perplexity chunk length (default: --seqlen)");
  sub->add_option("--eval-max-chunks", c.eval_max_chunks, "evaluate only the first K chunks (0 = all)");
  sub->add_option("--report", o->report, "write the JSON report here (atomically)");
  sub->add_option("--threads", c.threads, "CPU threads (0 = default)");
  add_recipe_option(sub);
  sub->footer(kMethodsHelp);
  sub->callback([o] { run_prune(*o); });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(prune, symprune::app::add_prune);
