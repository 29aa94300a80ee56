#include "core/error.h"
#include "dist/nccl_communicator.h"

namespace symprune::dist {

bool compiled_with_nccl() {
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  fail(
      "the NCCL communicator is not available: built without NCCL (configure with -DSYMPRUNE_WITH_CUDA=ON "
      "-DSYMPRUNE_WITH_NCCL=ON)");
}

}  // namespace symprune::dist
