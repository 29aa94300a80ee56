#pragma once
// The dense pass's statistics of one block (DESIGN.md §3.1), over all ranks: per linear the activation
// statistics, per group of linears fed the same input (LLaMA q/k/v and gate/up, OPT q/k/v) the Gram matrix
// G = XᵀX of that input (for the Gram-based refinements) and a fixed sample of its rows (the tokens at the
// same positions of every window, for the report's reconstruction error).
//
// Each rank runs the dense block on its chunks of calibration windows; the model calls the observer once
// per chunk (the micro-batch) and linear. Without output statistics, the other linears of a group take the
// group leader's statistics of the chunk (the same input: one pass over it, not one per linear). Chunk
// partials are added in global chunk order onto zeros (engine/ordered_reduce.h), so the statistics are
// bit-identical for any number of ranks and equal to the single-process ones. Statistics: one gather of
// every chunk's per-channel vectors per block (all linears fused into one buffer; a single process adds its
// chunks in place instead). Grams: one ordered chain per input group. Samples: one gather per input group,
// in rank order, which is chunk order.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "dist/communicator.h"
#include "engine/ordered_reduce.h"
#include "model/decoder_model.h"

namespace symprune::engine {

// G = XᵀX of one linear input, summed over the calibration chunks in fp64 (n × n, row-major).
struct Gram {
  int64_t n = 0;
  std::vector<double> g;
};

class BlockStatistics : public model::LinearObserver {
 public:
  // `model` gives the linears' shapes and input groups; outputs (Σy²) are collected when collect_output,
  // Grams when collect_gram, the input rows at `sample_positions` of every window when it is not empty
  // (their storage reserved for `local_windows`, this rank's windows: never grown to twice their size).
  BlockStatistics(dist::Communicator& comm, const model::DecoderModel& model, int64_t block, int64_t seq_len,
                  bool collect_output, bool collect_gram, std::vector<int64_t> sample_positions = {},
                  int64_t local_windows = 0);

  void on_linear(const model::LinearId& id, const Tensor& input, const Tensor& output,
                 const Tensor* output_bias) override;
  // Statistics and samples are taken in the backend's memory (Backend::activation_stats, copy_rows).
  bool reads_backend_tensors() const override { return true; }

  // Collective, after this rank's dense pass (also on a rank without chunks): combines every rank's chunks.
  void reduce();

  // After reduce().
  const ActivationStats& stats(const std::string& linear) const { return totals_.at(linear); }
  const Gram* gram(const std::string& linear) const;
  // The sampled input rows of the linear's group, all windows in order [K, n]; null without samples.
  const Tensor* samples(const std::string& linear) const;
  // Bytes this rank sent and received for the reduction (for the scaling figures); gram_bytes counts the
  // Gram matrices and the samples (the reconstruction-error data).
  int64_t stats_bytes() const { return stats_bytes_; }
  int64_t gram_bytes() const { return gram_bytes_; }

 private:
  struct Linear {
    std::string name;
    int64_t m = 0, n = 0;
    size_t group = 0;  // index into groups_
  };
  struct Group {
    std::string leader;  // the first linear of the group: its input is the group's
    int64_t n = 0;
    std::unique_ptr<OrderedChain> chain;
    Gram total;
    std::vector<float> local_samples;  // this rank's sampled rows, its chunks in order
    Tensor samples;                    // all ranks', after reduce()
  };
  size_t packed_length() const;
  // reduce()'s steps: the statistics' totals over this rank's chunks alone or every rank's, then the
  // recon samples and Gram matrices.
  void sum_own_chunks(size_t chunks);
  void sum_chunks_over_ranks(size_t chunks);
  void gather_samples_and_grams();
  const Group* group_of(const std::string& linear) const;  // null for an unknown linear

  dist::Communicator& comm_;
  Backend& backend_;
  int64_t seq_len_;
  bool collect_output_, collect_gram_;
  std::vector<int64_t> sample_positions_;
  std::vector<Linear> linears_;  // forward order
  std::vector<Group> groups_;
  std::map<std::string, std::vector<ActivationStats>> chunk_stats_;  // per linear, this rank's chunks
  std::map<std::string, ActivationStats> totals_;
  int64_t stats_bytes_ = 0, gram_bytes_ = 0;
};

}  // namespace symprune::engine
