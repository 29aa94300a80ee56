#include "process_setup.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "core/interrupt.h"

namespace symprune::app {

void use_passive_openmp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: run on with the default policy
}

void install_signal_handling() {
  // Past RLIMIT_FSIZE the kernel sends SIGXFSZ, which kills silently and leaves temporaries behind;
  // ignored, write() fails with EFBIG and the writers report it and clean up like any other error.
  std::signal(SIGXFSZ, SIG_IGN);
  // Before any other thread starts: SIGINT/SIGTERM/SIGHUP then stop the run at a safe point.
  interrupt::install();
}

}  // namespace symprune::app
