#pragma once
// Stage 1 of the pipeline (engine/prune_pipeline.h): validate and resolve. Everything a user can get wrong
// is checked here, before any block is read, on every rank (the same checks, so the same message), with
// the output directory checked and locked on rank 0 only.
#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "engine/mask_stage.h"
#include "engine/prune_pipeline.h"
#include "io/model_resolver.h"
#include "io/output_dir.h"
#include "io/tokenizer.h"
#include "model/decoder_model.h"
#include "model/perplexity.h"

namespace symprune::engine {

// A memory plan: what a run holds at the peak of a block, in bytes, by term, checked before any work
// against the memory available to it (plan_device_memory for a device-resident backend's memory,
// plan_host_memory for the host's). The device plan's terms: Activations, scores and the embeddings are fp32;
// the linear weights (blocks and head) and the hidden states between blocks are in the storage dtype
// (--dtype). `samples`: the inputs the reconstruction error reads (--recon-tokens), one group's on the device
// at a time, and their products with a block of a matrix's rows. `buffers`: what a run holds whatever its
// shapes (the fp32 conversion buffer of 16-bit tensors crossing the bus, the cuBLAS workspaces). NCCL's
// staging buffer is not in the plan: it is allocated with the communicator, before the free memory is read.
// `masks`: the bits of every block's masks, kept for the output (a host term).
struct MemoryPlan {
  double globals = 0, block_weights = 0, calibration = 0, activations = 0, evaluation = 0, selection = 0,
         gram = 0, samples = 0, masks = 0, buffers = 0;
  double total() const;
};
// The plan's terms in order: the report's key and the messages' name of each.
struct MemoryTerm {
  double MemoryPlan::*bytes;
  const char* key;
  const char* label;
};
inline constexpr std::array<MemoryTerm, 10> kMemoryTerms{{
    {&MemoryPlan::globals, "globals", "weights and head"},
    {&MemoryPlan::block_weights, "block_weights", "block weights"},
    {&MemoryPlan::calibration, "calibration", "calibration states"},
    {&MemoryPlan::activations, "activations", "activations"},
    {&MemoryPlan::evaluation, "evaluation", "evaluation"},
    {&MemoryPlan::selection, "selection", "selection"},
    {&MemoryPlan::gram, "gram", "Gram matrix"},
    {&MemoryPlan::samples, "samples", "reconstruction samples"},
    {&MemoryPlan::masks, "masks", "mask bits"},
    {&MemoryPlan::buffers, "buffers", "buffers"},
}};
inline double MemoryPlan::total() const {
  double sum = 0;
  for (const MemoryTerm& term : kMemoryTerms) sum += this->*term.bytes;
  return sum;
}
// The plan's terms as the report's "plan" object: each term's key → its bytes.
nlohmann::json memory_plan_json(const MemoryPlan& plan);

struct RunPlan {
  io::ResolvedModel resolved;
  std::unique_ptr<model::DecoderModel> model;
  std::string model_fingerprint;

  MaskSettings mask;
  std::string mask_description;
  double sparsity_target = 0.0;
  bool needs_stats = false;   // a dense pass with statistics runs (activation-aware scores or refinement)
  bool needs_output = false;  // Σy² is collected (output-side scores)
  bool collect_gram = false;  // Gram matrices (--refine recon, --refine-guard)
  // Positions within each calibration window whose inputs the report's reconstruction error reads
  // (empty: no reconstruction error).
  std::vector<int64_t> recon_sample_positions;

  int64_t seqlen = 0;
  int64_t micro_batch = 0;   // calibration windows per forward pass (a chunk)
  std::string calib_format;  // resolved; "synthetic" for random tokens
  std::unique_ptr<io::Tokenizer> tokenizer;

  bool evaluate = false;
  std::vector<int32_t> eval_tokens;
  model::PerplexityOptions eval_options;

  // Checkpoints: the run's identity without the calibration fingerprint (engine/checkpoint.h; the
  // pipeline adds it once the data is read), the evaluation text's fingerprint, and whether --resume found
  // this run's completion marker (the run then does nothing).
  nlohmann::json identity_without_calibration;
  std::string eval_fingerprint;
  bool already_complete = false;

  std::optional<io::OutputDirectory> out;         // rank 0, when an output is written
  std::unique_ptr<io::PathLock> checkpoint_lock;  // rank 0, with --checkpoint: one run per checkpoint
  std::unique_ptr<io::PathLock> report_lock;      // rank 0, with --report (io::lock_output_file)
  bool writes_model = false;
  nlohmann::json config;  // the resolved configuration, for the report and the provenance file

  // A device-resident backend: the memory plan checked before any work, the device's memory then and what
  // the plan was checked against (the report's "device_memory" sets the peak the run reached beside them).
  std::optional<MemoryPlan> device_plan;
  std::optional<DeviceMemory> device_at_start;
  double device_available = 0;
  // The host memory plan, what it was checked against (nullopt: the available memory could not be read)
  // and the resident size when it was checked (the report's "host_memory").
  MemoryPlan host_plan;
  std::optional<double> host_available;
  double host_resident_at_plan = 0;
};

// What a run's host memory plan depends on beyond the model (plan_host_memory), per rank.
struct HostMemoryShape {
  bool device_resident = false;  // the hidden states, weights and selection are in a device's memory
  int ranks = 1;
  int threads = 1;                   // CPU threads
  int64_t calib_tokens = 0;          // this rank's calibration tokens
  int64_t calib_chunks = 0;          // the run's calibration chunks (every rank gathers their statistics)
  int64_t local_chunks = 0;          // this rank's (a rank > 0 keeps its Gram partials until the total)
  int64_t tokens_per_pass = 0;       // tokens of one forward pass at most (0: the run makes none)
  int64_t attention_length = 0;      // the longest window or evaluation sequence a pass attends over
  int64_t eval_tokens = 0;           // this rank's evaluation tokens (each of the dense and pruned streams)
  int64_t eval_batch_tokens = 0;     // one evaluation batch's tokens (scored at the end: its final norm)
  std::vector<int64_t> gram_widths;  // the input width of each linear group whose Gram matrix is kept
  int64_t sample_rows = 0;           // the reconstruction error's sample rows (all ranks' windows)
  double sample_bytes = 0;           // what the host keeps of them (every group's, and this rank's own)
  bool recon_error = false, refine = false, compat_ria = false, checkpoint = false;
  // The bytes of the mask bits this rank keeps (ModelMasks: those of the tensors it writes); nullopt:
  // every block's.
  std::optional<double> kept_mask_bytes;
  // false: the run evaluates only (symprune eval): one block at a time, no selection, no masks.
  bool prunes = true;
  int eval_streams = 2;  // the dense and the pruned stream (symprune eval: one)
};

// Host memory no term of a plan counts (the libraries' pages, allocator slack), kept free on the CPU.
inline constexpr double kHostMemoryMargin = 256.0 * (1 << 20);

// What a run keeps in host memory at the peak of a block (a device-resident backend: the reconstruction
// samples, the mask bits and a checkpoint writer's copies; the rest is in the device plan). On the CPU every
// tensor is fp32: the globals; the current block (each linear's pruned weight replaces its dense one as
// soon as it is made, so one linear is held twice) and, on one rank, the next block, widened while this one
// computes; the hidden states and the dense pass's copy of them (and a third copy handed to a checkpoint's
// writer), and every chunk's statistics until they are reduced; the forward pass's workspace, which keeps
// its largest size; the selection of the largest linear; the Gram matrices of every input group in fp64;
// the mask bits this rank keeps; and per thread the attention's score rows and an allowance for BLAS
// buffers and heaps. Terms that are largest at different stages are added: the plan is an upper bound,
// 10-35 % above the growth measured on 1024-wide and 7B shapes (bench/results/host_memory_plan.md).
MemoryPlan plan_host_memory(const io::ModelConfig& config, DType stored, const HostMemoryShape& shape);

// Checks a host plan against this rank's share of the memory available (ranks_per_node ranks share it)
// plus what the run holds already and the plan counts (`held`: the globals, loaded with the model), less
// `margin`. Returns what it was checked against (nullopt: the available memory cannot be read); a plan that
// does not fit throws symprune::Error with its terms and `lower`, the options that lower them
// (E-HOST-MEMORY).
std::optional<double> check_host_memory(const MemoryPlan& plan, double held, double margin,
                                        int ranks_per_node, const std::vector<std::string>& lower);

// Collective (agree_on_errors): every rank returns the same plan or throws the same error.
RunPlan plan_run(const PruneConfig& config, dist::Communicator& comm);

// For a model of `config` kept in `storage`, calib_tokens calibration tokens on this rank, passes of
// tokens_per_pass tokens at most (a micro-batch, or one evaluation sequence when that is longer; 0 when the
// run makes no forward pass) and eval_tokens evaluation tokens on this rank. `prefetched`: the stored dtype
// of the next block's linears when they are uploaded while the current block computes (one rank: a third
// copy of a block at the peak); nullopt when several ranks upload at install time. `gram`: the run reads Gram
// matrices (--refine recon, --refine-guard), each computed on the device as an n × n fp32 matrix.
// `sample_rows`: the rows of the reconstruction error's samples on this rank (0: no reconstruction error).
MemoryPlan plan_device_memory(const io::ModelConfig& config, DType storage, int64_t calib_tokens,
                              int64_t tokens_per_pass, int64_t eval_tokens,
                              std::optional<DType> prefetched = std::nullopt, bool gram = false,
                              int64_t sample_rows = 0);

// The positions within each calibration window whose inputs the report's reconstruction error reads:
// ceil(tokens / windows) of the seqlen positions (at least 1, at most all; tokens 0 = all), evenly spaced,
// position j = ((2j + 1)·seqlen) / (2·count). The same for every window, rank and block.
std::vector<int64_t> recon_sample_positions(int64_t tokens, int64_t windows, int64_t seqlen);

}  // namespace symprune::engine
