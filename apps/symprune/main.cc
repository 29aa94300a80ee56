// symprune: prune large language models after training. Subcommands live in cmd_*.cc.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>

#include "command.h"
#include "core/error.h"
#include "core/log.h"

namespace symprune::app {

std::vector<CommandRegistration>& command_registry() {
  static std::vector<CommandRegistration> registry;
  return registry;
}

}  // namespace symprune::app

int main(int argc, char** argv) {
  using namespace symprune;
  // Past RLIMIT_FSIZE the kernel sends SIGXFSZ, which kills silently and leaves temporaries behind;
  // ignored, write() fails with EFBIG and the writers report it and clean up like any other error.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"symprune: post-training pruning of large language models (LLaMA, OPT)", "symprune"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (env SYMPRUNE_LOG_LEVEL)");
  auto& registry = app::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& command : registry) command.add(app);
  app.parse_complete_callback([&] { log::init(0, log_level); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every command-line error exits 1 like any other bad input.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "symprune: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symprune: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
