#pragma once
// Shared by the recipe harnesses: the recipe is read and applied to a subcommand shaped like `prune`
// (typed options, a list, a flag, two options that exclude each other, a non-configurable one).
#include <CLI/CLI.hpp>

#include "fuzz_support.h"
#include "symprune/recipe_config.h"

namespace symprune::fuzz {

inline void run_recipe(const uint8_t* data, size_t size, const std::string& file_name) {
  const auto dir = fresh_dir();
  const auto path = write_file(dir, file_name, as_view(data, size));
  // Reading alone covers every entry; applying covers the option lookup and value conversion.
  for (const auto& entry : app::read_recipe(path))
    if (entry.line < 1) violated("recipe entry without a line number", entry.key);

  CLI::App app("fuzz");
  CLI::App* sub = app.add_subcommand("prune", "");
  std::string model, method, group, nm, compat;
  int64_t nsamples = 0;
  int seqlen = 0;
  uint64_t seed = 0;
  double sparsity = 0, alpha = 0;
  bool force = false;
  std::vector<std::string> skip;
  sub->add_option("--model", model)->required();
  sub->add_option("--method", method)->check(CLI::IsMember({"magnitude", "wanda", "ria"}));
  sub->add_option("--alpha", alpha);
  auto* sparsity_option = sub->add_option("--sparsity", sparsity)->check(CLI::Range(0.0, 1.0));
  auto* group_option = sub->add_option("--group", group);
  auto* nm_option = sub->add_option("--nm", nm);
  sparsity_option->excludes(nm_option);
  nm_option->excludes(group_option);
  sub->add_option("--compat", compat);
  sub->add_option("--nsamples", nsamples);
  sub->add_option("--seqlen", seqlen);
  sub->add_option("--seed", seed);
  sub->add_option("--skip", skip);
  sub->add_flag("--force", force);
  sub->add_option("--out", model)->configurable(false);
  app::add_recipe_option(sub);
  app::apply_recipe(*sub, path);
}

}  // namespace symprune::fuzz
