#pragma once
// What every symprune executable does first in main().

namespace symprune::app {

// Idle OpenMP threads spin (libgomp's default active wait policy) and take the CPUs that OpenBLAS's own
// threads need: on a 2-core machine the default thread count ran ~2.5x slower than --threads 1. libgomp
// reads OMP_WAIT_POLICY once, when it is loaded, so the passive policy is set by re-executing the binary
// with it (before MPI or any thread starts); a policy the user set is left alone.
void use_passive_openmp_waits(char** argv);

// SIGXFSZ ignored (writers then see EFBIG and clean up) and the interrupt watcher (core/interrupt.h).
void install_signal_handling();

}  // namespace symprune::app
