#include "core/error.h"
#include "dist/mpi_communicator.h"

namespace symprune::dist {

bool compiled_with_mpi() {
  return false;
}

bool launched_by_mpi() {
  return false;
}

std::unique_ptr<MpiCommunicator> make_mpi_communicator(int*, char***) {
  fail("the MPI communicator is not available: built without MPI (install libopenmpi-dev, reconfigure)");
}

}  // namespace symprune::dist
