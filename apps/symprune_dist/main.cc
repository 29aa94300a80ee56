// symprune_dist: `symprune prune` over R ranks (DESIGN.md §4): `mpirun -n 8 symprune_dist --model ... --out
// ...` or `srun symprune_dist ...`. The same options and recipes as `symprune prune`
// (apps/symprune/prune_cli.h) plus --comm; the same pipeline (engine/prune_pipeline.h), whose output is
// byte-identical for every R.
//
// Failure: errors a user causes (options, paths, a full disk) are agreed on by all ranks, which all end
// with exit code 1 and rank 0 prints the message. Any other error on any rank prints that rank's message
// and ends every rank at once (MPI_Abort), so no rank waits in a collective. Interrupts stop all ranks at
// the next block (exit code 128 + signal).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/accel.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "dist/mpi_communicator.h"
#include "dist/nccl_communicator.h"
#include "engine/collective_errors.h"
#include "engine/prune_pipeline.h"
#include "io/output_dir.h"
#include "io/text_file.h"
#include "symprune/cli_checks.h"
#include "symprune/process_setup.h"
#include "symprune/prune_cli.h"

namespace {

using namespace symprune;

// --comm's value, checked on each rank before any communicator is made.
void check_comm_kind(const std::string& kind, const Backend& backend) {
  SYMPRUNE_CHECK(kind == "auto" || kind == "mpi" || kind == "nccl",
                 "--comm must be auto, mpi or nccl, got '{}'", kind);
  // Checked before NCCL starts: it would fail inside CUDA (no driver, no device) with a less helpful text.
  SYMPRUNE_CHECK(kind != "nccl" || backend.device_resident(),
                 "--comm nccl all-reduces GPU memory, one GPU per node-local rank, but this run is on the {} "
                 "({}); use --comm mpi (or auto), or run on GPUs with --device cuda",
                 backend.name(),
                 accel::device_count() > 0             ? std::string("--device cpu")
                 : accel::unavailable_reason().empty() ? std::string("no GPU")
                                                       : "no GPU: " + accel::unavailable_reason());
  SYMPRUNE_CHECK(
      kind != "nccl" || dist::compiled_with_nccl(),
      "--comm nccl: this symprune_dist is built without NCCL (configure with -DSYMPRUNE_WITH_NCCL=ON); "
      "use --comm mpi");
}

// Collective, after check_comm_kind passed on every rank. NCCL needs every rank on its own GPU (it refuses
// two ranks of one communicator on one device) and built in; "auto" takes it only when every rank can,
// "nccl" fails on every rank when some cannot, so all ranks make the same communicator.
std::unique_ptr<dist::Communicator> make_communicator(const std::string& kind, dist::MpiCommunicator& world,
                                                      const Backend& backend) {
  // The MPI world itself; one rank has nothing to carry, and NCCL would only take its buffers and setup.
  if (kind == "mpi" || (kind == "auto" && world.size() == 1)) return nullptr;
  // Why this rank cannot run NCCL, if it cannot. ("nccl" on a rank off the GPU or without NCCL failed in
  // check_comm_kind already, so "nccl" meets only shared GPUs here.)
  std::string unable;
  if (!backend.device_resident() || !dist::compiled_with_nccl())
    unable = fmt::format("rank {} is not on a GPU with NCCL", world.rank());
  else if (world.local_size() > accel::device_count())
    unable = fmt::format(
        "--comm nccl needs a GPU of its own for every rank (NCCL refuses two ranks on one GPU), but rank {} "
        "shares its node's GPUs among {} ranks; use --comm mpi, or at most as many ranks per node as GPUs",
        world.rank(), world.local_size());
  if (const auto failure = dist::first_failure(world, unable.empty() ? 0 : 1, unable)) {
    SYMPRUNE_CHECK(kind == "auto", "{}", failure->message);
    return nullptr;
  }
  return dist::make_nccl_communicator(world, accel::device_for_local_rank(world.local_rank()));
}

}  // namespace

int main(int argc, char** argv) {
  app::use_passive_openmp_waits(argv);
  app::install_signal_handling();
  io::record_command_line(argc, argv);  // before MPI may take its own arguments out
  std::unique_ptr<dist::MpiCommunicator> world;
  try {
    world = dist::make_mpi_communicator(&argc, &argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "symprune_dist: error: %s\n", io::printable_message(e.what()).c_str());
    return 1;
  }
  const int rank = world->rank(), size = world->size();
  const bool root = rank == 0;
  // Signal notices tagged like the log lines (a signal before this point is noticed as "symprune").
  interrupt::set_notice_prefix(size == 1 ? "symprune_dist"
                                         : fmt::format("symprune_dist [rank {}/{}]", rank, size));
  // A rank stops only where all ranks agree (engine/collective_errors.h), never alone inside a collective.
  interrupt::set_local_checks(size == 1);

  CLI::App app{
      "symprune_dist: post-training pruning of LLaMA/OPT models over MPI ranks (one per GPU or CPU "
      "socket); the options of `symprune prune`",
      "symprune_dist"};
  app.set_version_flag("--version",
                       fmt::format("symprune_dist {} (commit {}, {} build)", build_info::kVersion,
                                   build_info::kGitCommit, build_info::kBuildType));
  std::string log_level, comm_kind = "auto";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (env SYMPRUNE_LOG_LEVEL)");
  app.add_option(
      "--comm", comm_kind,
      "communicator: auto (NCCL when the run is on several GPUs, one per rank, and NCCL is built in, else "
      "MPI), mpi (host buffers) or nccl (one GPU per node-local rank, bootstrapped over MPI)");
  app::PruneCliOptions options;
  app::add_prune_options(&app, options);
  app::add_value_checks(app);
  // A command line that ends the run (an error, --help) ends it on every rank, even where only some ranks
  // got it (an MPMD launch with other options per rank): a rank returning alone would leave the others
  // waiting for it in their first collective.
  int64_t parse_end = 0;  // 0: go on; 1: ends with exit code 0 (--help, --version); 2: an error
  std::function<void()> say_why = [] {};
  try {
    if (const auto unknown = app::unknown_command_line_word(app, argc, argv))
      throw CLI::ValidationError(*unknown);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    parse_end = e.get_exit_code() == 0 ? 1 : 2;
    say_why = [&app, e] { app.exit(e); };
  } catch (const Error& e) {
    parse_end = 2;
    say_why = [message = io::printable_message(e.what())] {
      std::fprintf(stderr, "symprune_dist: error: %s\n", message.c_str());
    };
  }
  std::vector<int64_t> ends(static_cast<size_t>(size), 0);
  ends[static_cast<size_t>(rank)] = parse_end;
  world->all_reduce_sum(ends);
  const auto ended = std::find_if(ends.begin(), ends.end(), [](int64_t e) { return e != 0; });
  if (ended != ends.end()) {
    const bool same_everywhere =
        std::all_of(ends.begin(), ends.end(), [&](int64_t e) { return e == ends[0]; });
    // The same command line everywhere: rank 0 says why. Otherwise the lowest rank it ended says so.
    const int speaker = same_everywhere ? 0 : static_cast<int>(ended - ends.begin());
    if (rank == speaker) {
      if (!same_everywhere) {
        std::string others;  // the ranks whose command line does not end the run as this one's does
        for (int r = 0; r < size; ++r)
          if (ends[static_cast<size_t>(r)] != ends[static_cast<size_t>(speaker)])
            others += fmt::format("{}{}", others.empty() ? "" : ", ", r);
        std::fprintf(
            stderr,
            "symprune_dist: [rank %d/%d] the ranks got different command lines: this rank's ends the "
            "run, and not as that of rank %s does (every rank must get the same options):\n",
            rank, size, others.c_str());
      }
      say_why();
    }
    return same_everywhere && ends[0] == 1 ? 0 : 1;
  }

  try {
    log::init(rank, log_level, size);
    engine::PruneConfig config;
    std::unique_ptr<dist::Communicator> nccl;
    engine::agree_on_errors(*world, [&] {
      config = app::parsed_prune_config(options, world->local_rank(), world->local_size());
      check_comm_kind(comm_kind, *config.backend);
    });
    engine::agree_on_errors(*world, [&] { nccl = make_communicator(comm_kind, *world, *config.backend); });
    dist::Communicator& comm = nccl ? *nccl : *world;
    log::info("{} ranks over {} ({} node-local on this node), on {}", size, comm.name(), world->local_size(),
              config.backend->name());
    const engine::PruneResult result = engine::prune_model(config, comm);
    if (root) app::print_prune_result(config, result);
    return 0;
  } catch (const interrupt::Interrupted& e) {
    if (root) std::fprintf(stderr, "symprune_dist: %s\n", io::printable_message(e.what()).c_str());
    const int exit_code = e.exit_code();
    world.reset();                      // MPI_Finalize: the ranks leave together up to here
    fault::at("after_finalize", rank);  // tests: a rank slower to leave (a GPU context's teardown)
    return exit_code;
  } catch (const engine::CollectiveError& e) {
    if (root) std::fprintf(stderr, "symprune_dist: error: %s\n", io::printable_message(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    if (size == 1) {
      std::fprintf(stderr, "symprune_dist: error: out of memory\n");
      return 1;
    }
    std::fprintf(stderr, "symprune_dist: [rank %d/%d] error: out of memory\n", rank, size);
    world->abort(1);
  } catch (const std::exception& e) {
    // A single rank ends like symprune: nobody waits for it.
    if (size == 1) {
      std::fprintf(stderr, "symprune_dist: error: %s\n", io::printable_message(e.what()).c_str());
      return 1;
    }
    // Only this rank knows: say it, then end every rank (they may be waiting for this one).
    std::fprintf(stderr, "symprune_dist: [rank %d/%d] error: %s\n", rank, size,
                 io::printable_message(e.what()).c_str());
    world->abort(1);
  }
}
