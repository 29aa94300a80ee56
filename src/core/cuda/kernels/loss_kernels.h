#pragma once
// Host-only header: the per-token negative log-likelihood of perplexity (model/perplexity.cc's row_nll)
// on DEVICE logits, one slab of rows at a time (the caller bounds the slab, so the [rows, vocab] logits
// of a whole sequence are never held at once).
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// nll[r] = log Σ_j exp(logits[r, j] − max_r) + max_r − logits[r, targets[r]] in fp64, for r < rows.
// targets (device, int32) must be in [0, vocab) (checked by the caller).
void launch_row_nll(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, double* nll,
                    DeviceStream stream);

}  // namespace symprune::cuda
