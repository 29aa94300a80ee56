// `symprune info`: version, build options, CPU threading, BLAS and the accelerators this process sees
// (or why it sees none). Must work on any machine, including one without a GPU driver.
#include <fmt/format.h>

#include "command.h"
#include "core/accel.h"
#include "core/backend.h"
#include "core/build_info.h"
#include "dist/nccl_communicator.h"

// OpenBLAS is the required BLAS (cmake/dependencies.cmake sets BLA_VENDOR); cblas.h's include
// directory is private to symprune_core, so the one query used here is declared directly.
extern "C" char* openblas_get_config(void);

namespace symprune::app {
namespace {

void print_info() {
  fmt::print("symprune {}\n", build_info::kVersion);
  fmt::print("build: {}, {}\n", build_info::kBuildType, build_info::kCxxCompiler);
  if (accel::compiled_with_cuda()) {
    fmt::print("CUDA: on ({}, architectures {})\n", build_info::kCudaCompiler,
               build_info::kCudaArchitectures);
  } else {
    fmt::print("CUDA: off\n");
  }
  fmt::print("NCCL: {}\n", dist::compiled_with_nccl() ? "on" : "off");
  fmt::print("OpenMP threads: {}\n", cpu_threads());
  fmt::print("BLAS: {} ({})\n", build_info::kBlas, openblas_get_config());
  const auto devices = accel::devices();
  if (devices.empty()) {
    fmt::print("CUDA devices: 0 ({})\n", accel::unavailable_reason());
    return;
  }
  fmt::print("CUDA devices: {}\n", devices.size());
  for (const auto& d : devices) {
    fmt::print("  [{}] {}, {:.1f} GiB, compute capability {}.{}, {}\n", d.index, d.name,
               static_cast<double>(d.total_memory_bytes) / (1024.0 * 1024.0 * 1024.0),
               d.compute_capability_major, d.compute_capability_minor,
               d.memory_pools ? "memory pools" : "no memory pools (plain cudaMalloc)");
  }
}

void add_info(CLI::App& app) {
  auto* command = app.add_subcommand("info", "Show version, build options, threads, BLAS and GPUs found");
  command->callback(print_info);
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(info, symprune::app::add_info);
