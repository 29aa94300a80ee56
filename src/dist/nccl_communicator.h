#pragma once
// Host-only header (no NCCL or CUDA types): the NCCL communicator, built with SYMPRUNE_WITH_NCCL
// (dist/nccl); without it, dist/no_nccl provides these functions and make_nccl_communicator throws.
#include <memory>

#include "dist/communicator.h"

namespace symprune::dist {

bool compiled_with_nccl();

// One rank per GPU. `bootstrap` (the MPI communicator; the local one for a single process) carries
// NCCL's unique id from rank 0 to every rank; the NCCL communicator has bootstrap's rank and size and
// runs on CUDA device `device`. The collectives take host spans and stage them through device
// memory for now; device-resident buffers come with the CUDA backend. Throws symprune::Error when
// NCCL is not built in, or on any CUDA/NCCL failure (no driver, no device, ...).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);

}  // namespace symprune::dist
