#pragma once
// `--recipe FILE`: a flat TOML or YAML file holding a subcommand's options (`nsamples = 128` or
// `nsamples: 128`); options given on the command line override it.
//
// CLI11 2.1.2 reads a set_config() file only for the top-level app, never for a subcommand, so the recipe is
// applied by the `--recipe` option's own callback: it runs after the command line has been parsed and before
// CLI11 checks required/excluded options, so a recipe may supply required options such as --model.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

namespace symprune::app {

// One `key = value` / `key: value` entry of a recipe.
struct RecipeEntry {
  std::string key;                  // as written in the file
  std::vector<std::string> values;  // the option's inputs as text; several for a list
  int line = 0;                     // 1-based line of the key in the file
};

enum class RecipeFormat { kToml, kYaml };

// By extension (.toml, .yaml, .yml); otherwise by the first significant line: `[...]` or `key = ...` is TOML,
// `key: ...` or `---` is YAML.
RecipeFormat detect_recipe_format(const std::filesystem::path& path, const std::string& text);

// Reads a flat recipe. Throws symprune::Error naming the file (and the line, when known) if it cannot be
// read, is malformed, nests tables/mappings, repeats a key or leaves a value empty.
std::vector<RecipeEntry> read_recipe(const std::filesystem::path& path);

// Sets every option of `subcommand` named in the recipe (dashes or underscores) that the command line did not
// set, nor an option it excludes. Throws symprune::Error naming the file and key for an unknown key, a list
// given to a single-value option, a value the option rejects, or two recipe keys that exclude each other.
void apply_recipe(CLI::App& subcommand, const std::filesystem::path& path);

// Registers `--recipe FILE` on `subcommand`; call it after the subcommand's other options (any order works,
// but then --help lists it last).
CLI::Option* add_recipe_option(CLI::App* subcommand);

}  // namespace symprune::app
