#pragma once
// Host-only header (no NCCL or CUDA types): the NCCL communicator, built with SYMPRUNE_WITH_NCCL
// (dist/nccl); without it, dist/no_nccl provides these functions and make_nccl_communicator throws.
#include <memory>

#include "dist/communicator.h"

namespace symprune::dist {

bool compiled_with_nccl();

// The device buffer through which the NCCL communicator stages every message: allocated when it is made
// (so the memory plan, which reads the free memory afterwards, sees it), never grown; larger collectives
// pass in rounds (make_chunked_communicator).
constexpr size_t kNcclStagingBytes = size_t{64} << 20;

// One rank per GPU. `bootstrap` (the MPI communicator; the local one for a single process) carries
// NCCL's unique id from rank 0 to every rank; the NCCL communicator has bootstrap's rank and size and
// runs on CUDA device `device`. The collectives take host spans and stage them through
// kNcclStagingBytes of device memory. Throws symprune::Error, on every rank, when NCCL is not built in or
// a step before NCCL's rendezvous fails (no driver, no device, no memory for the staging buffer, ...); a
// rank failing inside NCCL's setup (ncclCommInitRank, connecting peers) prints its message and ends the
// job through bootstrap.abort(1), since the other ranks wait inside NCCL where no agreement reaches them.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);

}  // namespace symprune::dist
