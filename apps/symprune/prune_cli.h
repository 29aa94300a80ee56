#pragma once
// The options of `symprune prune` and `symprune_dist` (one definition: both run the same pipeline with
// the same options and recipes) and the table both print.
#include <CLI/CLI.hpp>
#include <deque>
#include <string>

#include "engine/prune_pipeline.h"

namespace symprune::app {

// A boolean set by two flags, "--x" and "--no-x" (a recipe may say `x = false` too). Registered as two
// flags rather than CLI11's "--x,!--no-x", whose help line "--x,--no-x{false}" reads as "default off".
struct Switch {
  bool* value = nullptr;
  bool on = false, off = false;
  CLI::Option *on_option = nullptr, *off_option = nullptr;
  void resolve() const {
    if (off_option->count() > 0) *value = !off;
    if (on_option->count() > 0) *value = on;
  }
};

struct PruneCliOptions {
  engine::PruneConfig config;
  double alpha = 0.0;
  double sparsity = 0.0;
  std::string out;
  std::string report;
  std::string checkpoint;
  std::string device = "auto";
  CLI::Option* alpha_option = nullptr;
  CLI::Option* sparsity_option = nullptr;
  CLI::Option* recipe_option = nullptr;
  CLI::App* command = nullptr;  // the subcommand holding these options
  std::deque<Switch> switches;  // the flags' storage (a deque: elements never move)
};

// Adds every prune option, --recipe and the methods help to `sub`; values land in `o`.
void add_prune_options(CLI::App* sub, PruneCliOptions& o);

// What every command's --model takes, the synthetic shapes named ("model directory, short name ...").
std::string model_option_description();

// The pipeline configuration once the command line (and recipe) are parsed; --device is resolved to a
// backend (accel::backend_for_device, the node-local rank picking the GPU), which throws when it is
// unusable.
engine::PruneConfig parsed_prune_config(PruneCliOptions& o, int local_rank = 0, int local_size = 1);

// stdout: per-layer table, sparsity total, perplexities, "wrote OUT".
void print_prune_result(const engine::PruneConfig& config, const engine::PruneResult& result);

}  // namespace symprune::app
