// `--recipe FILE.yaml`: the YAML reader (yaml-cpp) and applying its entries to a subcommand.
#include "recipe_fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors(
      [&] { symprune::fuzz::run_recipe(data, size, "recipe.yaml"); });
}
