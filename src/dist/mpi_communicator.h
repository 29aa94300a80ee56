#pragma once
// Host-only header (no mpi.h): the MPI communicator, built with SYMPRUNE_WITH_MPI (dist/mpi); without it,
// dist/no_mpi provides these functions and make_mpi_communicator throws.
#include <memory>

#include "dist/communicator.h"

namespace symprune::dist {

bool compiled_with_mpi();

// Whether this process was started by an MPI launcher (mpirun/mpiexec of Open MPI or MPICH, srun with
// PMI/PMIx), read from the environment without initializing MPI.
bool launched_by_mpi();

// MPI_COMM_WORLD on host buffers. Initializes MPI (MPI_THREAD_FUNNELED: only the thread that made it
// calls MPI) and finalizes it when the communicator is destroyed. local_rank() is the rank among the
// processes of the same node (MPI_COMM_TYPE_SHARED), used to pick one GPU per rank.
class MpiCommunicator : public Communicator {
 public:
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
};
std::unique_ptr<MpiCommunicator> make_mpi_communicator(int* argc, char*** argv);

}  // namespace symprune::dist
