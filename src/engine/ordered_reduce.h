#pragma once
// Sums over the calibration set that do not depend on the number of ranks (issue: "determinism is the
// contract"). The calibration windows are cut into chunks of a fixed number of windows (the forward
// micro-batch, the same whatever R is); chunks are spread over ranks in contiguous runs; each chunk gives
// a partial sum. The single-process pipeline always added those partials to a running total in chunk
// order, total = ((0 + p₀) + p₁) + …, so that is the definition for every R:
//  * ordered_sum: the partials themselves are exchanged (one all-gather of every chunk's vector) and each
//    rank adds them in chunk order — for the per-channel statistics, small vectors.
//  * OrderedChain: the running total travels rank to rank (0 → 1 → … → R−1) and each rank adds its chunks'
//    partials in order before passing it on; the last rank broadcasts it. For the n×n Gram matrices, where
//    gathering every chunk's matrix would cost J·n² per rank. Rank 0 adds at once; the others keep their
//    chunks' partials until the total reaches them.
// Either way the floating-point additions are those of one process, in the same order: bit-identical.
#include <cstdint>
#include <span>
#include <vector>

#include "dist/communicator.h"

namespace symprune::engine {

// `local` holds this rank's chunks' partial vectors back to back (count × length doubles), chunks in
// order; ranks hold consecutive runs of chunks, rank 0 the first. Every rank gets the total of all
// chunks' partials, added in chunk order to zeros. Collective: every rank calls it with the same length.
// `gathered_bytes` (optional) receives the size of all chunks' partials, what each rank ends up holding.
std::vector<double> ordered_sum(dist::Communicator& comm, std::span<const double> local, size_t length,
                                int64_t* gathered_bytes = nullptr);

class OrderedChain {
 public:
  OrderedChain(dist::Communicator& comm, size_t length);
  // This rank's next chunk's partial (fp32, as a float matrix product gives it), in chunk order.
  void add(std::span<const float> partial);
  // Collective: returns the total, the same on every rank.
  std::vector<double> finish();

 private:
  dist::Communicator& comm_;
  size_t length_;
  std::vector<double> total_;                // rank 0: the running total
  std::vector<std::vector<float>> pending_;  // other ranks: partials waiting for the running total
};

}  // namespace symprune::engine
