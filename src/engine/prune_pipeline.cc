#include "engine/prune_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/masks.h"
#include "core/scores.h"
#include "engine/pruned_model_writer.h"
#include "engine/refine_linear.h"
#include "io/calibration.h"
#include "io/model_layout.h"
#include "io/model_resolver.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/decoder_model.h"
#include "model/fingerprint.h"
#include "model/perplexity.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kDefaultSeqlen = 2048;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_text_file(const fs::path& path, const char* option) {
  SYMPRUNE_CHECK(fs::is_regular_file(path), "{} {}: no such file", option, path.string());
  std::ifstream in(path, std::ios::binary);
  SYMPRUNE_CHECK(in.good(), "{} {}: cannot open", option, path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  SYMPRUNE_CHECK(!in.bad(), "{} {}: read error", option, path.string());
  return buffer.str();
}

// 64-bit hash of a tensor's contents, word-wise (fast enough to run on every linear input).
uint64_t content_hash(const Tensor& t) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(t.numel());
  const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(float);
  const auto* p = reinterpret_cast<const unsigned char*>(t.data());
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// The Gram matrix G = XᵀX of one linear input, summed over micro-batches in fp64.
struct Gram {
  int64_t n = 0;
  std::vector<double> g;
};

// Dense-pass observer: activation statistics per linear and (optionally) the Gram matrices of the
// distinct inputs. Consecutive linears fed identical inputs (q/k/v, gate/up) share one Gram.
class BlockObserver : public model::LinearObserver {
 public:
  BlockObserver(Backend& backend, int64_t seq_len, bool collect_output, bool collect_gram)
      : backend_(backend), seq_len_(seq_len), collect_output_(collect_output), collect_gram_(collect_gram) {}

  void on_linear(const model::LinearId& id, const Tensor& input, const Tensor& output) override {
    const int64_t n = input.dim(-1);
    const int64_t rows = input.numel() / n;
    static const Tensor kNoOutput;
    stats_[id.name].accumulate(input, collect_output_ ? output : kNoOutput, rows / seq_len_, seq_len_);
    if (!collect_gram_) return;
    const uint64_t hash = content_hash(input);
    const bool same_as_previous =
        have_previous_ && previous_numel_ == input.numel() && previous_n_ == n && previous_hash_ == hash;
    size_t index;
    if (same_as_previous) {
      index = previous_gram_;
      gram_of_[id.name] = index;
    } else {
      auto it = gram_of_.find(id.name);
      if (it == gram_of_.end()) {
        grams_.push_back(
            std::make_unique<Gram>(Gram{n, std::vector<double>(static_cast<size_t>(n * n), 0.0)}));
        it = gram_of_.emplace(id.name, grams_.size() - 1).first;
      }
      index = it->second;
      accumulate_gram(*grams_[index], input, rows, n);
    }
    have_previous_ = true;
    previous_hash_ = hash;
    previous_numel_ = input.numel();
    previous_n_ = n;
    previous_gram_ = index;
  }

  // Called between micro-batches is not needed: the "same input" test compares with the previous call,
  // and the first linear of a micro-batch never matches the last one of the previous micro-batch
  // (different widths or contents), which is harmless either way since both would map consistently.

  ActivationStats& stats(const std::string& name) { return stats_.at(name); }
  const Gram* gram(const std::string& name) const {
    auto it = gram_of_.find(name);
    return it == gram_of_.end() ? nullptr : grams_[it->second].get();
  }

 private:
  void accumulate_gram(Gram& gram, const Tensor& input, int64_t rows, int64_t n) {
    // G += XᵀX as one sgemm: linear(x = Xᵀ [n, rows], W = Xᵀ) = Xᵀ X.
    transposed_.resize({n, rows});
    const float* x = input.data();
    float* xt = transposed_.data();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) xt[c * rows + r] = x[r * n + c];
    backend_.linear(transposed_, transposed_, nullptr, product_);
    const float* p = product_.data();
    for (size_t i = 0; i < gram.g.size(); ++i) gram.g[i] += static_cast<double>(p[i]);
  }

  Backend& backend_;
  int64_t seq_len_;
  bool collect_output_;
  bool collect_gram_;
  std::map<std::string, ActivationStats> stats_;
  std::vector<std::unique_ptr<Gram>> grams_;
  std::map<std::string, size_t> gram_of_;
  bool have_previous_ = false;
  uint64_t previous_hash_ = 0;
  int64_t previous_numel_ = 0, previous_n_ = 0;
  size_t previous_gram_ = 0;
  Tensor transposed_, product_;
};

// Σ_r a_r G a_rᵀ for A [m, n] (fp32 sgemm A·G, then the elementwise sum in fp64), clamped at 0.
double quadratic_form(Backend& backend, const Tensor& a, const Tensor& g) {
  Tensor product;
  backend.linear(a, g, nullptr, product);  // A Gᵀ = A G (G symmetric)
  double sum = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += static_cast<double>(a[i]) * static_cast<double>(product[i]);
  return std::max(sum, 0.0);
}

// ‖(W − W̃)X‖ / ‖WX‖ from G = XᵀX; nullopt when ‖WX‖ = 0 and ΔW ≠ 0.
std::optional<double> reconstruction_error(Backend& backend, const Tensor& weight, const Mask& mask,
                                           const Gram& gram) {
  if (mask.count() == 0) return 0.0;
  const int64_t n = gram.n;
  Tensor g({n, n});
  for (int64_t i = 0; i < n * n; ++i) g[i] = static_cast<float>(gram.g[static_cast<size_t>(i)]);
  Tensor delta({weight.dim(0), weight.dim(1)});
  const auto flat = mask.flat();
  for (int64_t i = 0; i < weight.numel(); ++i) delta[i] = flat[static_cast<size_t>(i)] ? weight[i] : 0.0f;
  const double dense = quadratic_form(backend, weight, g);
  const double diff = quadratic_form(backend, delta, g);
  if (dense <= 0.0) return diff <= 0.0 ? std::optional<double>(0.0) : std::nullopt;
  return std::sqrt(diff / dense);
}

std::string canonical_block_prefix(const io::ModelConfig& config, int64_t block) {
  return config.family == io::ModelFamily::kLlama ? "model.layers." + std::to_string(block) + "."
                                                  : "model.decoder.layers." + std::to_string(block) + ".";
}

// Stands in for the tokenizer when calibrating from a token file (never asked to encode).
class NoTokenizer : public io::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool) const override {
    fail("internal: no tokenizer was loaded for token-file calibration");
  }
  std::string decode(const std::vector<int32_t>&) const override { return {}; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  int64_t vocab_size() const override { return 0; }
  std::string kind() const override { return "none"; }
};

struct ResolvedMask {
  MaskSpec spec;
  bool compat_ria_fp16 = false;
  std::string group;  // resolved group name for the report: row, layer or N:M
};

ResolvedMask resolve_mask(const PruneConfig& c, ScoreMethod method) {
  ResolvedMask r;
  SYMPRUNE_CHECK(c.compat == "none" || c.compat == "wanda" || c.compat == "ria",
                 "--compat must be none, wanda or ria, got '{}'", c.compat);
  SYMPRUNE_CHECK(c.group.empty() || c.group == "row" || c.group == "layer",
                 "--group must be row or layer, got '{}'", c.group);
  SYMPRUNE_CHECK(c.sparsity.has_value() != !c.nm.empty(),
                 "give exactly one of --sparsity R (unstructured) or --nm N:M (semi-structured)");
  r.compat_ria_fp16 = c.compat == "ria";
  if (!c.nm.empty()) {
    SYMPRUNE_CHECK(c.group.empty(), "--group applies to --sparsity only, not to --nm {}", c.nm);
    const NmPattern p = parse_nm(c.nm);
    r.spec = MaskSpec::nm(p);
    r.group = c.nm;
    return r;
  }
  const double rho = *c.sparsity;
  SYMPRUNE_CHECK(rho >= 0.0 && rho < 1.0, "--sparsity {} is outside [0, 1)", rho);
  bool layer = c.group == "layer";
  bool le = false;
  if (c.compat != "none") {
    if (method == ScoreMethod::kMagnitude) {
      layer = true;  // magnitude is per-layer "≤ θ" in every reference repo
    } else if (c.compat == "ria" && c.group.empty()) {
      layer = true;  // RIA's default (no --per_outneuron) is per-layer for every method
    }
    le = layer;
  }
  r.spec = layer ? MaskSpec::layer(rho, le) : MaskSpec::row(rho);
  r.group = layer ? "layer" : "row";
  return r;
}

// DSnoT's --skip_layer rule (reference notes §5.1): attention projections are the "self_attn.*"
// linears of both families; everything else (LLaMA mlp.*, OPT fc1/fc2) is the MLP.
bool refine_skips(const std::string& skip, const std::string& linear) {
  const bool attention = linear.rfind("self_attn.", 0) == 0;
  return (skip == "mlp" && !attention) || (skip == "attn" && attention);
}

// NaN/Inf in a linear's dense-pass inputs poison every statistic and mask downstream: name the first one.
void check_finite_stats(const ActivationStats& stats, const std::string& linear, int64_t block) {
  for (size_t c = 0; c < stats.in_sumsq.size(); ++c) {
    SYMPRUNE_CHECK(
        std::isfinite(stats.in_sumsq[c]) && std::isfinite(stats.in_sum[c]),
        "non-finite activations (NaN or Inf) reach the input of {} (input channel {}) in the dense "
        "pass of block {}: the weights of the blocks before it or the calibration data make the "
        "fp32 forward overflow",
        linear, c, block);
  }
  for (size_t r = 0; r < stats.out_sumsq.size(); ++r)
    SYMPRUNE_CHECK(std::isfinite(stats.out_sumsq[r]),
                   "non-finite activations (NaN or Inf) in the output of {} (output channel {}) in the dense "
                   "pass of block {}",
                   linear, r, block);
}

}  // namespace

nlohmann::json PruneResult::report() const {
  nlohmann::json layer_list = nlohmann::json::array();
  for (const auto& l : layers) {
    layer_list.push_back(
        {{"name", l.name},
         {"shape", l.shape},
         {"sparsity", l.sparsity},
         {"pruned", l.pruned},
         {"recon_error", l.recon_error ? nlohmann::json(*l.recon_error) : nlohmann::json()}});
    if (l.refine) {
      layer_list.back()["refine"] = {
          {"swaps", l.refine->swaps},
          {"mean_abs_error_before", l.refine->mean_abs_error_before},
          {"mean_abs_error_after", l.refine->mean_abs_error_after},
          {"rows_reverted", l.refine->rows_reverted},
          {"recon_sq_change",
           l.refine->recon_sq_change ? nlohmann::json(*l.refine->recon_sq_change) : nlohmann::json()},
          {"recon_error_initial",
           l.recon_error_initial ? nlohmann::json(*l.recon_error_initial) : nlohmann::json()}};
    } else {
      layer_list.back()["refine"] = nullptr;
    }
  }
  nlohmann::json j = {
      {"command", "prune"},
      {"config", config},
      {"seed", config.value("seed", nlohmann::json(0))},
      {"fingerprints",
       {{"model", model_fingerprint},
        {"calibration",
         calibration_fingerprint.empty() ? nlohmann::json() : nlohmann::json(calibration_fingerprint)}}},
      {"model_dir", model_dir.string()},
      {"mask", mask_description},
      {"sparsity",
       {{"total", sparsity_total()},
        {"target", sparsity_target},
        {"pruned", pruned_total},
        {"params", params_total}}},
      {"layers", layer_list},
      {"timings",
       {{"calibration", timings.calibration},
        {"blocks", timings.blocks},
        {"scores_masks", timings.scores_masks},
        {"refine", timings.refine},
        {"write", timings.write},
        {"eval", timings.eval},
        {"total", timings.total}}},
  };
  if (perplexity) {
    j["perplexity"] = {{"dense", perplexity->dense},
                       {"pruned", perplexity->pruned},
                       {"seqlen", perplexity->seqlen},
                       {"chunks", perplexity->chunks}};
  }
  return j;
}

PruneResult prune_model(const PruneConfig& c, const ProgressFn& progress) {
  const auto start = Clock::now();
  set_cpu_threads(c.threads);
  PruneResult result;

  // --- Everything cheap is checked before any weight is read.
  const ScoreMethod method = parse_score_method(c.method);
  ScoreOptions base;
  base.alpha = c.alpha ? *c.alpha : std::numeric_limits<double>::quiet_NaN();
  base.p = c.p;
  base.strategy = c.strategy;
  base.beta = c.beta;
  base.seed = c.method_seed;
  base.matrix_name = "--method " + std::string(score_method_name(method));
  validate_score_options(method, base);
  const ResolvedMask mask = resolve_mask(c, method);
  base.compat_ria_fp16 = mask.compat_ria_fp16;
  const RefineSettings refine_settings = resolve_refine_settings(c);
  const bool refining = refine_settings.enabled();
  const bool scores_need_stats = score_method_needs_stats(method, base);
  SYMPRUNE_CHECK(!scores_need_stats || !c.calib.empty(),
                 "method {} is activation-aware and needs calibration data: give --calib FILE",
                 score_method_name(method));
  SYMPRUNE_CHECK(!refining || !c.calib.empty(),
                 "--refine {} reads activation statistics and needs calibration data: give --calib FILE",
                 c.refine);
  const bool needs_stats = scores_need_stats || refining;
  SYMPRUNE_CHECK(c.nsamples >= 1, "--nsamples must be at least 1, got {}", c.nsamples);
  SYMPRUNE_CHECK(c.seqlen >= 0, "--seqlen must be at least 1, got {}", c.seqlen);
  SYMPRUNE_CHECK(c.eval_seqlen >= 0, "--eval-seqlen must be at least 2, got {}", c.eval_seqlen);
  SYMPRUNE_CHECK(c.eval_max_chunks >= 0, "--eval-max-chunks must be >= 0, got {}", c.eval_max_chunks);

  const io::ResolvedModel resolved = io::resolve_model(c.model);
  result.model_dir = resolved.dir;
  check_output_dir(resolved.dir, c.out, c.force);
  const std::string eval_text = c.eval.empty() ? std::string() : read_text_file(c.eval, "--eval");
  if (!needs_stats && !c.calib.empty())
    log::info("method {} reads no activations: --calib {} is not used", score_method_name(method), c.calib);

  model::DecoderModel model = model::DecoderModel::open(resolved.dir);
  const io::SafetensorsModel stored = io::SafetensorsModel::open_dir(resolved.dir);
  const io::ModelConfig& mc = model.config();
  const fs::path config_json = resolved.dir / "config.json";
  // T: --seqlen, else 2048; under --compat wanda the Wanda repo's rule, T = max_position_embeddings.
  const int64_t seqlen = c.seqlen > 0 ? c.seqlen : c.compat == "wanda" ? model.max_seq_len() : kDefaultSeqlen;
  const int64_t eval_seqlen = c.eval_seqlen > 0 ? c.eval_seqlen : seqlen;
  SYMPRUNE_CHECK(c.eval.empty() || eval_seqlen >= 2, "--eval-seqlen must be at least 2, got {}", eval_seqlen);
  result.model_fingerprint = model::model_fingerprint(resolved.dir);
  if (needs_stats)
    SYMPRUNE_CHECK(seqlen <= model.max_seq_len(), "--seqlen {} exceeds max_position_embeddings {} of {}",
                   seqlen, model.max_seq_len(), config_json.string());
  if (!c.eval.empty())
    SYMPRUNE_CHECK(eval_seqlen <= model.max_seq_len(),
                   "--eval-seqlen {} exceeds max_position_embeddings {} of {}", eval_seqlen,
                   model.max_seq_len(), config_json.string());
  // Every linear shape is the same in each block: check the mask spec against them once, up front.
  for (const auto& e : io::expected_block_tensors(mc, 0)) {
    const std::string prefix = canonical_block_prefix(mc, 0);
    const std::string local = e.name.substr(prefix.size());
    for (const auto& name : model.linear_names())
      if (local == name + ".weight") validate_mask_spec(mask.spec, e.shape[0], e.shape[1], "0." + name);
  }

  // Token files need no tokenizer: a model directory without one can still be pruned from them.
  const std::string calib_format =
      needs_stats ? io::resolve_calibration_format(c.calib, c.calib_format, model.vocab_size()) : "";
  const bool token_file = calib_format == "tokens-u16" || calib_format == "tokens-u32";
  std::unique_ptr<io::Tokenizer> tokenizer;
  if ((needs_stats && !token_file) || !c.eval.empty()) tokenizer = io::load_tokenizer(resolved.dir);
  std::vector<int32_t> eval_tokens;
  model::PerplexityOptions ppl_options;
  if (!c.eval.empty()) {
    eval_tokens = tokenizer->encode(eval_text, /*add_bos=*/true);
    SYMPRUNE_CHECK(static_cast<int64_t>(eval_tokens.size()) >= eval_seqlen,
                   "--eval {}: {} tokens, fewer than one chunk of {}", c.eval, eval_tokens.size(),
                   eval_seqlen);
    for (size_t i = 0; i < eval_tokens.size(); ++i)
      SYMPRUNE_CHECK(eval_tokens[i] >= 0 && eval_tokens[i] < model.vocab_size(),
                     "--eval {}: token id {} at position {} is outside the model vocabulary of {}", c.eval,
                     eval_tokens[i], i, model.vocab_size());
    ppl_options.seqlen = eval_seqlen;
    ppl_options.max_chunks = c.eval_max_chunks;
  }

  // The resolved configuration, recorded in the report.
  result.mask_description = describe(mask.spec);
  result.sparsity_target = mask.spec.kind == MaskSpec::kNM
                               ? static_cast<double>(mask.spec.n) / static_cast<double>(mask.spec.m)
                               : mask.spec.sparsity;
  const double alpha = resolved_alpha(method, base);
  result.config = {
      {"model", c.model},
      {"model_dir", resolved.dir.string()},
      {"model_source", resolved.source},
      {"method", std::string(score_method_name(method))},
      {"alpha", std::isnan(alpha) ? nlohmann::json() : nlohmann::json(alpha)},
      {"p", std::isinf(c.p) ? nlohmann::json("inf") : nlohmann::json(c.p)},  // JSON has no infinity
      {"strategy", c.strategy},
      {"beta", c.beta},
      {"method_seed", c.method_seed},
      {"sparsity", c.sparsity ? nlohmann::json(*c.sparsity) : nlohmann::json()},
      {"group", mask.group},
      {"nm", c.nm.empty() ? nlohmann::json() : nlohmann::json(c.nm)},
      {"mask", result.mask_description},
      {"compat", c.compat},
      {"compat_ria_fp16", mask.compat_ria_fp16},
      {"refine", refine_config_json(refine_settings)},
      {"calib", c.calib.empty() ? nlohmann::json() : nlohmann::json(c.calib)},
      {"calib_used", needs_stats},
      {"calib_format", c.calib_format},
      {"nsamples", c.nsamples},
      {"seqlen", seqlen},
      {"seed", c.seed},
      {"out", c.out.string()},
      {"force", c.force},
      {"eval", c.eval.empty() ? nlohmann::json() : nlohmann::json(c.eval)},
      {"eval_seqlen", eval_seqlen},
      {"eval_max_chunks", c.eval_max_chunks},
      {"threads", cpu_threads()},
      {"recon_error", "||(W-W~)X||_F/||WX||_F on the dense-pass inputs of each block, via G = X^T X"},
  };

  // --- Calibration and embeddings (activation-aware methods only).
  Tensor hidden;
  int64_t n_seqs = 0;
  if (needs_stats) {
    const auto t = Clock::now();
    io::CalibrationOptions co;
    co.file = c.calib;
    co.nsamples = c.nsamples;
    co.seqlen = seqlen;
    co.seed = c.seed;
    co.format = calib_format;
    const NoTokenizer no_tokenizer;
    const io::Tokenizer& calib_tokenizer =
        tokenizer ? *tokenizer : static_cast<const io::Tokenizer&>(no_tokenizer);
    const io::CalibrationSet calib = io::load_calibration(co, calib_tokenizer, model.vocab_size());
    result.calibration_fingerprint = calib.fingerprint;
    result.config["calib_format"] = calib.format;
    n_seqs = calib.nsamples;
    hidden = model.embed(calib.tokens, calib.nsamples, calib.seqlen);
    result.timings.calibration = seconds_since(t);
    log::info("calibration: {} windows of {} tokens from {} ({})", calib.nsamples, calib.seqlen, c.calib,
              calib.format);
  }

  // --- Dense perplexity, before any weight changes (after the calibration data, whose errors come first).
  std::optional<PerplexityPair> ppl;
  if (!c.eval.empty()) {
    const auto t = Clock::now();
    const auto r = model::evaluate_perplexity(model, eval_tokens, ppl_options);
    ppl = PerplexityPair{r.perplexity, 0.0, r.seqlen, r.chunks};
    result.timings.eval += seconds_since(t);
    log::info("dense perplexity {:.4f} ({} chunks of {})", r.perplexity, r.chunks, r.seqlen);
  }

  // --- Block by block.
  std::map<std::string, PackedMask> masks;  // stored tensor name -> mask, one bit per weight
  Backend& backend = model.backend();
  const bool keep_pruned = !c.eval.empty();
  const bool needs_output = score_method_uses_output_stats(method) && needs_stats;
  for (int64_t b = 0; b < model.num_blocks(); ++b) {
    std::unique_ptr<BlockObserver> observer;
    if (needs_stats) {
      const auto t = Clock::now();
      observer = std::make_unique<BlockObserver>(backend, seqlen, needs_output, /*collect_gram=*/true);
      Tensor dense = hidden;
      model.run_block(b, dense, n_seqs, seqlen, observer.get());
      result.timings.blocks += seconds_since(t);
    }
    const auto ts = Clock::now();
    const model::BlockWeights& weights = model.block_weights(b);
    std::vector<std::pair<model::LinearId, Tensor>> pruned_weights;
    double refine_seconds = 0.0;
    for (const auto& name : model.linear_names()) {
      const model::LinearId id{b, name};
      const Tensor& w = weights.linears.at(name).weight;
      ScoreOptions options = base;
      options.block = b;
      options.matrix_name = id.to_string();
      const ActivationStats* stats = observer ? &observer->stats(name) : nullptr;
      if (stats) check_finite_stats(*stats, id.to_string(), b);
      const Tensor scores = compute_scores(method, w, scores_need_stats ? stats : nullptr, options);
      Mask m = select_mask(scores, mask.spec, options.matrix_name);
      LayerResult layer;
      layer.name = id.to_string();
      layer.shape = w.shape();
      const Gram* gram = observer ? observer->gram(name) : nullptr;
      SYMPRUNE_ASSERT(!observer || gram != nullptr, "no Gram matrix for {}", layer.name);
      if (refining && !refine_skips(c.refine_skip, name)) {
        layer.recon_error_initial = reconstruction_error(backend, w, m, *gram);
        const auto tr = Clock::now();
        std::optional<NmPattern> nm;
        if (mask.spec.kind == MaskSpec::kNM) nm = NmPattern{mask.spec.n, mask.spec.m};
        layer.refine = refine_linear(refine_settings, w, *stats, gram->g.data(), gram->n, m, nm);
        refine_seconds += seconds_since(tr);
      }
      layer.pruned = m.count();
      layer.sparsity = m.sparsity();
      if (gram) layer.recon_error = reconstruction_error(backend, w, m, *gram);
      result.pruned_total += layer.pruned;
      result.params_total += w.numel();
      result.layers.push_back(layer);
      Tensor pruned = w;
      m.apply(pruned);
      pruned_weights.emplace_back(id, std::move(pruned));
      const std::string canonical = canonical_block_prefix(mc, b) + name + ".weight";
      const auto stored_name = io::stored_tensor_name(stored, canonical);
      SYMPRUNE_ASSERT(stored_name.has_value(), "tensor {} vanished from {}", canonical,
                      resolved.dir.string());
      masks.emplace(*stored_name, PackedMask::of(m));
    }
    // All linears were scored from the dense block; now the block becomes the pruned one.
    for (auto& [id, w] : pruned_weights) model.set_linear_weight(id, std::move(w));
    result.timings.refine += refine_seconds;
    result.timings.scores_masks += seconds_since(ts) - refine_seconds;
    if (needs_stats) {
      const auto t = Clock::now();
      observer.reset();
      model.run_block(b, hidden, n_seqs, seqlen);
      result.timings.blocks += seconds_since(t);
    }
    if (!keep_pruned) model.release_block(b);
    if (progress) progress({b, model.num_blocks(), seconds_since(start)});
  }
  hidden = Tensor();

  // --- Output.
  {
    const auto t = Clock::now();
    write_pruned_model(resolved.dir, c.out, masks, c.force);
    result.timings.write = seconds_since(t);
  }
  if (ppl) {
    const auto t = Clock::now();
    const auto r = model::evaluate_perplexity(model, eval_tokens, ppl_options);
    ppl->pruned = r.perplexity;
    result.timings.eval += seconds_since(t);
    log::info("pruned perplexity {:.4f}", r.perplexity);
  }
  result.perplexity = ppl;
  result.timings.total = seconds_since(start);
  return result;
}

}  // namespace symprune::engine
