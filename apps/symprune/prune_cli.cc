#include "prune_cli.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "cli_checks.h"
#include "core/accel.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/checkpoint.h"
#include "io/synthetic_model.h"
#include "recipe_config.h"

namespace symprune::app {
namespace {

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
The paper's stochRIA and p-norm tables use alpha 1 (for ria too): give --alpha 1 to reproduce them.

Masks: --sparsity R prunes exactly floor(n*R) weights per output row (--group row, default) or
floor(m*n*R) per matrix (--group layer); --nm N:M prunes N of every M consecutive inputs in each row.
--compat wanda: magnitude per layer with the reference "<= threshold" rule, other methods as asked
(--group layer uses "<= threshold"), and --seqlen defaults to max_position_embeddings. --compat ria: per layer "<= threshold" unless --group row, and
RIA's fp16 rounding of the relative-importance term for ri and ria. --compat dsnot: as wanda, with
--seqlen 2048 (DSnoT's fixed length), but with --refine dsnot or r2dsnot magnitude's initial mask is per row
(DSnoT's --initial_method magnitude), and N:M DSnoT prunes the group's smallest score whatever its sign (the
DSnoT code's pick); the refinement options' defaults are DSnoT's already.

Refinement (--refine, after the initial mask, before the pruned pass; only the mask changes):
  dsnot     DSnoT: per output row, swap one pruned and one kept weight per cycle to drive the expected
            error e_r = sum over pruned c of W[r,c]*mu_c towards 0 (mu_c: mean per-sequence input sum);
            regrow by W*mu/var^p (--var-power), prune by the Wanda score (N:M: by the initial score of
            magnitude and wanda, as the DSnoT code) split by the sign of W*mu;
            a row stops for good when |e_r| <= --refine-threshold, after --max-cycles cycles, (with
            --same-sign; always for N:M) when a swap would flip the sign of its error, or when its next
            swap would not move e_r towards 0 or a candidate list runs out (the row keeps its pruned
            count; the reference code's pointers run on there). N:M: the pruned weight is in the
            regrown one's group; a group without a kept weight that moves e_r towards 0 passes that
            regrow candidate over, spending the cycle (--compat dsnot: the code's prune pick, the
            group's smallest initial score whatever its sign).
  r2dsnot   R2-DSnoT: DSnoT with the relative factor 1/||W~[r,:]||1 + 1/||W~[:,c]||1 in the regrow key
            (--grow-relative) and the prune key (--prune-relative), a_c^--refine-alpha in the prune key,
            and lp regularizers gamma*||row after the move||_p (--reg-p, --gamma-grow, --gamma-prune).
            Defaults: the equations as written (both factors on, gammas 0). The paper's ablation found
            both factors on its worst setting and reports as best: on a Wanda base --no-prune-relative
            --gamma-prune 1e-4, on an RIA base --no-grow-relative --gamma-prune 1e-3.
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

void add_switch(CLI::App* sub, std::deque<Switch>& switches, const std::string& on, const std::string& off,
                bool& value, const std::string& description) {
  Switch& s = switches.emplace_back();
  s.value = &value;
  s.on_option = sub->add_flag(on, s.on, description);
  s.off_option = sub->add_flag(off, s.off, "the opposite of " + on);
  s.on_option->excludes(s.off_option);
}

// Options given (on the command line or in a recipe) that this configuration does not read are said, so
// that a mistyped --method or a forgotten --refine does not pass for the run that was asked for.
void warn_about_unread_options(const CLI::App& command, const engine::PruneConfig& c) {
  const bool dsnot_family = c.refine == "dsnot" || c.refine == "r2dsnot";
  const bool r2 = c.refine == "r2dsnot";
  const struct {
    const char* option;
    bool read;
    const char* reader;
  } rules[] = {
      {"--p", c.method == "lp", "--method lp"},
      {"--strategy", c.method == "lp", "--method lp"},
      {"--beta", c.method == "stochria", "--method stochria"},
      {"--method-seed", c.method == "stochria", "--method stochria"},
      {"--refine-skip", c.refine != "none", "a refinement (--refine)"},
      {"--max-cycles", c.refine != "none", "a refinement (--refine)"},
      {"--refine-threshold", dsnot_family, "--refine dsnot or r2dsnot"},
      {"--var-power", dsnot_family, "--refine dsnot or r2dsnot"},
      {"--same-sign", dsnot_family, "--refine dsnot or r2dsnot"},
      {"--grow-relative", r2, "--refine r2dsnot"},
      {"--no-grow-relative", r2, "--refine r2dsnot"},
      {"--prune-relative", r2, "--refine r2dsnot"},
      {"--no-prune-relative", r2, "--refine r2dsnot"},
      {"--reg-p", r2, "--refine r2dsnot"},
      {"--gamma-grow", r2, "--refine r2dsnot"},
      {"--gamma-prune", r2, "--refine r2dsnot"},
      {"--refine-alpha", r2, "--refine r2dsnot"},
      {"--calib-format", !c.calib.empty(), "--calib"},
      {"--eval-seqlen", !c.eval.empty(), "--eval"},
      {"--eval-max-chunks", !c.eval.empty(), "--eval"},
      {"--recon-tokens", c.recon_error, "the reconstruction error (on by default; off by --no-recon-error)"},
      {"--checkpoint-every", !c.checkpoint.empty(), "--checkpoint"},
  };
  for (const auto& rule : rules)
    if (!rule.read && command.get_option(rule.option)->count() > 0)
      log::warn("{} is not used: only {} reads it", rule.option, rule.reader);
}

}  // namespace

engine::PruneConfig parsed_prune_config(PruneCliOptions& o, int local_rank, int local_size) {
  for (const auto& sw : o.switches) sw.resolve();  // into o.config, before it is copied
  engine::PruneConfig c = o.config;
  if (o.alpha_option->count() > 0) c.alpha = o.alpha;
  if (o.sparsity_option->count() > 0) c.sparsity = o.sparsity;
  // 0 stands for "not given" in the configuration (the default, 2048 or the model's length): not a value.
  SYMPRUNE_CHECK(o.command->get_option("--seqlen")->count() == 0 || c.seqlen >= 1,
                 "--seqlen must be at least 1, got {}", c.seqlen);
  c.out = o.out;
  c.report = o.report;  // checked before pruning, written by the pipeline at the end
  c.checkpoint = o.checkpoint;
  if (o.recipe_option->count() > 0) c.input_files.push_back(o.recipe_option->as<std::string>());
  c.backend = &accel::backend_for_device(o.device, local_rank);
  if (c.backend->device_resident()) c.ranks_per_device = accel::ranks_sharing_device(local_rank, local_size);
  c.ranks_per_node = std::max(local_size, 1);
  if (log::is_root()) warn_about_unread_options(*o.command, c);
  return c;
}

void print_prune_result(const engine::PruneConfig& c, const engine::PruneResult& result) {
  if (result.already_complete) {
    std::printf("already complete: this run finished earlier (marker %s); nothing was done\n",
                engine::checkpoint_marker(c.resume == "auto" ? c.checkpoint : std::filesystem::path(c.resume))
                    .c_str());
    return;
  }
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
  std::printf("sparsity.total: %.6f (%lld of %lld weights, target %.10g, %s)\n", result.sparsity_total(),
              static_cast<long long>(result.pruned_total), static_cast<long long>(result.params_total),
              result.sparsity_target, result.mask_description.c_str());
  // Weights that were zero before (a pruned model pruned again) make the written model sparser.
  if (result.zeros_total && *result.zeros_total != result.pruned_total)
    std::printf("sparsity.written: %.6f (%lld zeros in the written linears: %lld were zero already)\n",
                static_cast<double>(*result.zeros_total) / static_cast<double>(result.params_total),
                static_cast<long long>(*result.zeros_total),
                static_cast<long long>(*result.zeros_total - result.pruned_total));
  if (result.perplexity) {
    std::printf("perplexity.dense: %.6f\n", result.perplexity->dense);
    std::printf("perplexity.pruned: %.6f\n", result.perplexity->pruned);
  }
  if (!c.out.empty()) std::printf("wrote %s (%.2f s)\n", c.out.string().c_str(), result.timings.total);
}

std::string model_option_description() {
  return fmt::format(
      "model directory, short name (llama2-7b), Hugging Face repo id, or "
      "synthetic:<shape>[:seed][:layers=<n>] "
      "(random weights of a published shape, for timing and memory runs: {})",
      fmt::join(io::synthetic_shapes(), ", "));
}

void add_prune_options(CLI::App* sub, PruneCliOptions& options) {
  PruneCliOptions* o = &options;
  o->command = sub;
  engine::PruneConfig& c = o->config;
  sub->add_option("--model", c.model, model_option_description())->required();
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
                  "none (default), wanda, ria or dsnot: reproduce that tool's mask rules (see below)");
  sub->add_option("--refine", c.refine,
                  "mask refinement: none (default), dsnot, r2dsnot or recon (see below)");
  sub->add_flag("--refine-guard", c.refine_guard,
                "refinement: restore a row's initial mask when refining raised its reconstruction error");
  sub->add_option("--refine-skip", c.refine_skip,
                  "linears left unrefined: mlp (default, as DSnoT), attn or none");
  sub->add_option("--max-cycles", c.refine_options.max_cycles,
                  "refinement: cycles per row at most, one swap each (default 50)");
  sub->add_option("--refine-threshold", c.refine_options.threshold,
                  "refinement: a row stops when |e_r| <= this (default 0.1, in per-sequence-sum units)");
  sub->add_option("--var-power", c.refine_options.var_power,
                  "refinement: regrow key divides by var^this (default 1; 0 = no division)");
  sub->add_flag("--same-sign", c.refine_options.same_sign,
                "refinement: stop a row before a swap flips the sign of its error (always on for N:M)");
  // One flag per spelling: CLI11 prints a negatable pair as "--x,--no-x{false}", which reads as "off".
  add_switch(sub, o->switches, "--grow-relative", "--no-grow-relative", c.r2.grow_relative,
             "r2dsnot: relative factor in the regrow key (default on)");
  add_switch(sub, o->switches, "--prune-relative", "--no-prune-relative", c.r2.prune_relative,
             "r2dsnot: relative factor in the prune key (default on)");
  sub->add_option("--reg-p", c.r2.reg_p, "r2dsnot: regularizer norm 1, 2 or inf (default 2)");
  sub->add_option("--gamma-grow", c.r2.gamma_grow, "r2dsnot: regrow regularization weight (default 0)");
  sub->add_option("--gamma-prune", c.r2.gamma_prune, "r2dsnot: prune regularization weight (default 0)");
  sub->add_option("--refine-alpha", c.r2.alpha, "r2dsnot: prune key activation exponent (default 0.5)");
  sub->add_option("--calib", c.calib,
                  "calibration data: C4-style JSONL (.jsonl/.json, optionally .gz), plain text, a token file "
                  "(.bin), or 'synthetic' (uniformly random token ids from --seed, for synthetic models); "
                  "required by activation-aware methods");
  sub->add_option("--calib-format", c.calib_format,
                  "auto (by file name), jsonl, text, tokens-u16 or tokens-u32 (default auto)");
  sub->add_option("--tokenizer", c.tokenizer,
                  "tokenizer file or directory for a text --calib and for --eval (default: the model "
                  "directory's; a synthetic model has none)");
  sub->add_option("--nsamples", c.nsamples, "calibration windows (default 128)");
  sub->add_option("--micro-batch", c.micro_batch,
                  "calibration windows per forward pass (default, or 0: 16384 / seqlen); part of the "
                  "result's definition (statistics are summed per pass), never derived from the number of "
                  "ranks");
  sub->add_option(
      "--seqlen", c.seqlen,
      "tokens per calibration window (default 2048; with --compat wanda: max_position_embeddings, or "
      "the sliding window where shorter)");
  add_python_seed_option(sub, "--seed", c.seed,
                         "calibration sampling seed with Python's random.seed(S) semantics (default 0; a "
                         "negative S is |S|, as in Python)");
  sub->add_option(
      "--out", o->out,
      "output directory (Hugging Face layout); must not lie inside the input; required except for "
      "synthetic models (timing runs)");
  sub->add_flag("--force", c.force, "replace an existing non-empty --out");
  sub->add_option("--eval", c.eval,
                  "text file: report perplexity of the dense and the pruned model (one BOS at its start, "
                  "chunks of --eval-seqlen tokens)");
  sub->add_option("--eval-seqlen", c.eval_seqlen, "perplexity chunk length (default, or 0: --seqlen)");
  sub->add_option("--eval-max-chunks", c.eval_max_chunks, "evaluate only the first K chunks (0 = all)");
  sub->add_option("--report", o->report, "write the JSON report here (atomically)");
  add_switch(
      sub, o->switches, "--recon-error", "--no-recon-error", c.recon_error,
      "report ||(W-W~)X||/||WX|| per linear on the dense-pass inputs (default on; over --recon-tokens "
      "sampled tokens: two products of K rows per linear, K*n values per input exchanged between ranks)");
  sub->add_option("--recon-tokens", c.recon_tokens,
                  "tokens the reconstruction error is computed over: the same ceil(K/nsamples) evenly "
                  "spaced positions of every window (default 1024; 0 = all tokens, exact)");
  sub->add_option("--checkpoint", o->checkpoint,
                  "HDF5 checkpoint file: the state between blocks is saved there (FILE.prev keeps the one "
                  "before), so a killed or stopped run can continue with --resume; SIGTERM/SIGUSR1 then save "
                  "it at the next block and exit with code 75");
  sub->add_option("--checkpoint-every", c.checkpoint_every,
                  "save a checkpoint every K blocks and after the last (default 1)");
  sub->add_option("--resume", c.resume,
                  "continue a run: auto (the newest usable checkpoint at --checkpoint, or start fresh when "
                  "there is none; does nothing when the run already finished) or a checkpoint FILE");
  sub->add_option("--threads", c.threads, "CPU threads (0 = default)");
  sub->add_option("--device", o->device,
                  "where the model, statistics, scores and masks run: auto (a CUDA GPU when one is present, "
                  "else the CPU; the default), cuda or cpu. In fp32 the results agree with the CPU's "
                  "(statistics and scores bit for bit, forward passes within rounding)");
  sub->add_option("--dtype", c.dtype,
                  "what the linear weights and the hidden states between blocks are kept in: auto (the "
                  "model's dtype on a GPU, fp32 on the CPU; the default), bf16 or fp16 (GPU only: products "
                  "in 16 bits on tensor cores, accumulated in fp32; norms, attention, statistics and scores "
                  "in fp32) or fp32. The output keeps the input's weights and dtype either way");
  o->recipe_option = add_recipe_option(sub);
  sub->footer(kMethodsHelp);
}

}  // namespace symprune::app
