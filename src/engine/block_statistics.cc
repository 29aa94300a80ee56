#include "engine/block_statistics.h"

#include <cstddef>
#include <span>

#include "core/error.h"

namespace symprune::engine {

BlockStatistics::BlockStatistics(dist::Communicator& comm, const model::DecoderModel& model, int64_t block,
                                 int64_t seq_len, bool collect_output, bool collect_gram,
                                 std::vector<int64_t> sample_positions, int64_t local_windows)
    : comm_(comm),
      backend_(model.backend()),
      seq_len_(seq_len),
      collect_output_(collect_output),
      collect_gram_(collect_gram),
      sample_positions_(std::move(sample_positions)) {
  (void)block;
  const auto shapes = model.linear_shapes();
  const auto groups = model.linear_input_groups();
  for (const auto& shape : shapes) {
    Linear l{shape.name, shape.out, shape.in, 0};
    int memberships = 0;
    for (size_t g = 0; g < groups.size(); ++g)
      for (const auto& member : groups[g])
        if (member == shape.name) {
          l.group = g;
          ++memberships;
        }
    // Each linear in exactly one group: a group's members take its leader's statistics (on_linear).
    SYMPRUNE_ASSERT(memberships == 1, "linear {} is in {} input groups, not one", shape.name, memberships);
    linears_.push_back(l);
  }
  for (const auto& members : groups) {
    Group g;
    g.leader = members.front();
    for (const auto& l : linears_)
      if (l.name == g.leader) g.n = l.n;
    if (collect_gram_) g.chain = std::make_unique<OrderedChain>(comm_, static_cast<size_t>(g.n * g.n));
    g.local_samples.reserve(
        static_cast<size_t>(local_windows * static_cast<int64_t>(sample_positions_.size()) * g.n));
    groups_.push_back(std::move(g));
  }
}

void BlockStatistics::on_linear(const model::LinearId& id, const Tensor& input, const Tensor& output,
                                const Tensor* output_bias) {
  const int64_t n = input.dim(-1);
  const int64_t rows = input.numel() / n;
  const int64_t windows = rows / seq_len_;
  // A fresh partial per chunk: total = Σ chunks in order (engine/ordered_reduce.h). The other linears of
  // a group read the same input (the model's contract, linear_input_groups): without output statistics
  // they take the leader's partial of this chunk instead of computing it again.
  const Group* group = group_of(id.name);
  auto& chunks = chunk_stats_[id.name];
  if (!collect_output_ && group != nullptr && group->leader != id.name) {
    const auto& leader_chunks = chunk_stats_[group->leader];
    SYMPRUNE_ASSERT(leader_chunks.size() == chunks.size() + 1 && leader_chunks.back().in_features() == n,
                    "statistics of {} before its group's leader {} in chunk {}", id.name, group->leader,
                    chunks.size());
    chunks.push_back(leader_chunks.back());
  } else {
    chunks.push_back(backend_.activation_stats(input, collect_output_ ? &output : nullptr, output_bias,
                                               windows, seq_len_));
  }
  for (auto& group : groups_) {
    if (group.leader != id.name) continue;
    if (!sample_positions_.empty()) {
      // The sampled rows, copied in the backend's memory (runs of consecutive positions at once: a copy per
      // window with --recon-tokens 0) and brought to the host at once.
      const auto count = static_cast<int64_t>(sample_positions_.size());
      const auto position = [&](int64_t j) { return sample_positions_[static_cast<size_t>(j)]; };
      Tensor sampled = backend_.allocate({windows * count, n});
      for (int64_t w = 0; w < windows; ++w)
        for (int64_t j = 0, run = 1; j < count; j += run, run = 1) {
          while (j + run < count && position(j + run) == position(j) + run) ++run;
          backend_.copy_rows(input, w * seq_len_ + position(j), sampled, w * count + j, run);
        }
      Tensor copy;
      const Tensor& host = backend_.host_view(sampled, copy);
      group.local_samples.insert(group.local_samples.end(), host.data(), host.data() + host.numel());
    }
    if (!collect_gram_) continue;
    // G_chunk = XᵀX, computed where the input is (Backend::gram).
    group.chain->add(backend_.gram(input).values());
  }
}

size_t BlockStatistics::packed_length() const {
  size_t length = 0;
  for (const auto& l : linears_) length += static_cast<size_t>(3 * l.n + (collect_output_ ? l.m : 0) + 1);
  return length;
}

void BlockStatistics::reduce() {
  size_t chunks = chunk_stats_.empty() ? 0 : chunk_stats_.begin()->second.size();
  for (const auto& [name, list] : chunk_stats_)
    SYMPRUNE_ASSERT(list.size() == chunks, "{}: {} chunks, others {}", name, list.size(), chunks);
  if (comm_.size() == 1) {
    sum_own_chunks(chunks);
  } else {
    sum_chunks_over_ranks(chunks);
  }
  chunk_stats_.clear();
  gather_samples_and_grams();
}

// One rank: the chunks added in their order onto zeros, as ordered_sum adds them (the same sums, bit for
// bit), without packing them into one vector and gathering it (megabytes per block copied for nothing).
void BlockStatistics::sum_own_chunks(size_t chunks) {
  const auto add = [](std::vector<double>& total, const std::vector<double>& part) {
    SYMPRUNE_ASSERT(part.size() == total.size(), "a statistic of {} values for {}", part.size(),
                    total.size());
    for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  };
  for (const auto& l : linears_) {
    ActivationStats s;
    s.in_sumsq.assign(static_cast<size_t>(l.n), 0.0);
    s.in_sum.assign(static_cast<size_t>(l.n), 0.0);
    s.in_seqsq.assign(static_cast<size_t>(l.n), 0.0);
    if (collect_output_) s.out_sumsq.assign(static_cast<size_t>(l.m), 0.0);
    double n_seqs = 0.0;
    const auto found = chunk_stats_.find(l.name);
    SYMPRUNE_ASSERT(found != chunk_stats_.end() || chunks == 0, "no statistics of {} in {} chunks", l.name,
                    chunks);
    if (found != chunk_stats_.end()) {
      for (const ActivationStats& chunk : found->second) {
        add(s.in_sumsq, chunk.in_sumsq);
        add(s.in_sum, chunk.in_sum);
        add(s.in_seqsq, chunk.in_seqsq);
        if (collect_output_) add(s.out_sumsq, chunk.out_sumsq);
        n_seqs += static_cast<double>(chunk.n_seqs);
      }
    }
    s.n_seqs = static_cast<int64_t>(n_seqs);
    s.seq_len = seq_len_;
    totals_[l.name] = std::move(s);
  }
}

// Several ranks: every rank's chunks gathered and added in chunk order (ordered_sum). Packed per chunk, per
// linear: in_sumsq, in_sum, in_seqsq, [out_sumsq], n_seqs.
void BlockStatistics::sum_chunks_over_ranks(size_t chunks) {
  const size_t length = packed_length();
  std::vector<double> packed;
  packed.reserve(chunks * length);
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    for (const auto& l : linears_) {
      const ActivationStats& s = chunk_stats_.at(l.name)[chunk];
      packed.insert(packed.end(), s.in_sumsq.begin(), s.in_sumsq.end());
      packed.insert(packed.end(), s.in_sum.begin(), s.in_sum.end());
      packed.insert(packed.end(), s.in_seqsq.begin(), s.in_seqsq.end());
      if (collect_output_) packed.insert(packed.end(), s.out_sumsq.begin(), s.out_sumsq.end());
      packed.push_back(static_cast<double>(s.n_seqs));
    }
  }
  SYMPRUNE_ASSERT(packed.size() == chunks * length, "packed {} for {} chunks of {}", packed.size(), chunks,
                  length);
  int64_t gathered = 0;
  const std::vector<double> total = ordered_sum(comm_, packed, length, &gathered);
  if (comm_.size() > 1) stats_bytes_ += gathered;

  size_t at = 0;
  auto take = [&](int64_t count) {
    std::vector<double> v(total.begin() + static_cast<std::ptrdiff_t>(at),
                          total.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(count)));
    at += static_cast<size_t>(count);
    return v;
  };
  for (const auto& l : linears_) {
    ActivationStats s;
    s.in_sumsq = take(l.n);
    s.in_sum = take(l.n);
    s.in_seqsq = take(l.n);
    if (collect_output_) s.out_sumsq = take(l.m);
    s.n_seqs = static_cast<int64_t>(total[at++]);
    s.seq_len = seq_len_;
    totals_[l.name] = std::move(s);
  }
}

void BlockStatistics::gather_samples_and_grams() {
  if (!sample_positions_.empty()) {
    for (auto& group : groups_) {
      // Rank order is chunk order (each rank holds a contiguous run of chunks).
      const int64_t local_rows = static_cast<int64_t>(group.local_samples.size()) / group.n;
      std::vector<int64_t> rows_per_rank(static_cast<size_t>(comm_.size()));
      comm_.all_gather(std::as_bytes(std::span<const int64_t>(&local_rows, 1)),
                       std::as_writable_bytes(std::span<int64_t>(rows_per_rank)));
      std::vector<int64_t> counts;
      int64_t total_rows = 0;
      for (int64_t r : rows_per_rank) {
        counts.push_back(r * group.n * static_cast<int64_t>(sizeof(float)));
        total_rows += r;
      }
      group.samples = Tensor({total_rows, group.n});
      comm_.all_gather_v(std::as_bytes(std::span<const float>(group.local_samples)), counts,
                         std::as_writable_bytes(std::span<float>(
                             group.samples.data(), static_cast<size_t>(group.samples.numel()))));
      if (comm_.size() > 1) gram_bytes_ += static_cast<int64_t>(2 * group.samples.numel() * sizeof(float));
      group.local_samples = {};
    }
  }
  if (!collect_gram_) return;
  for (auto& group : groups_) {
    group.total.n = group.n;
    group.total.g = group.chain->finish();
    group.chain.reset();
    if (comm_.size() > 1) gram_bytes_ += static_cast<int64_t>(2 * group.total.g.size() * sizeof(double));
  }
}

const BlockStatistics::Group* BlockStatistics::group_of(const std::string& linear) const {
  for (const auto& l : linears_)
    if (l.name == linear) return &groups_[l.group];
  return nullptr;
}

const Tensor* BlockStatistics::samples(const std::string& linear) const {
  const Group* group = sample_positions_.empty() ? nullptr : group_of(linear);
  return group ? &group->samples : nullptr;
}

const Gram* BlockStatistics::gram(const std::string& linear) const {
  const Group* group = collect_gram_ ? group_of(linear) : nullptr;
  return group ? &group->total : nullptr;
}

}  // namespace symprune::engine
