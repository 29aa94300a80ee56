// symprune: prune large language models after training. Subcommands live in cmd_*.cc.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "cli_checks.h"
#include "command.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "io/output_dir.h"
#include "io/text_file.h"
#include "process_setup.h"

namespace symprune::app {

std::vector<CommandRegistration>& command_registry() {
  static std::vector<CommandRegistration> registry;
  return registry;
}

}  // namespace symprune::app

int main(int argc, char** argv) {
  using namespace symprune;
  app::use_passive_openmp_waits(argv);
  app::install_signal_handling();
  io::record_command_line(argc, argv);
  CLI::App app{"symprune: post-training pruning of large language models (LLaMA, OPT)", "symprune"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("symprune {} (commit {}, {} build)", build_info::kVersion,
                                                build_info::kGitCommit, build_info::kBuildType));
  // Options of the top level (--log-level) may also come after the subcommand.
  app.fallthrough();
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (env SYMPRUNE_LOG_LEVEL)");
  auto& registry = app::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& command : registry) command.add(app);
  app::add_value_checks(app);
  app.parse_complete_callback([&] { log::init(0, log_level); });
  try {
    if (const auto unknown = app::unknown_command_line_word(app, argc, argv))
      throw CLI::ValidationError(*unknown);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every command-line error exits 1 like any other bad input.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const interrupt::Interrupted& e) {
    std::fprintf(stderr, "symprune: %s\n", io::printable_message(e.what()).c_str());
    return e.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "symprune: error: %s\n", io::printable_message(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(
        stderr,
        "symprune: error: out of memory: the run needs more memory than this machine or job allows "
        "(lower --nsamples, --seqlen or --threads for prune, --batch or --seqlen for eval, or run on a "
        "larger machine)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symprune: error: %s\n", io::printable_message(e.what()).c_str());
    return 1;
  }
  return 0;
}
