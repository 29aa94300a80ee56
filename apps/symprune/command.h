#pragma once
// Subcommands register themselves here (one cmd_*.cc file each), so main.cc needs no list.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace symprune::app {

struct CommandRegistration {
  std::string name;
  // Adds the subcommand (options + callback) to `app`. The callback throws symprune::Error on bad input.
  std::function<void(CLI::App& app)> add;
};

std::vector<CommandRegistration>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::function<void(CLI::App&)> add) {
    command_registry().push_back({std::move(name), std::move(add)});
  }
};

}  // namespace symprune::app

#define SYMPRUNE_REGISTER_COMMAND(name, function) \
  static ::symprune::app::CommandRegistrar symprune_command_registrar_##name(#name, function)
