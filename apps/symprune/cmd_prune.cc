// symprune prune: the layer-wise pruning pipeline (engine/prune_pipeline.h) in one process: calibration,
// per-block statistics, scores, masks, pruned passes, a pruned Hugging Face model out, a report. The
// options are shared with symprune_dist (prune_cli.h).
#include <memory>

#include "command.h"
#include "engine/prune_pipeline.h"
#include "prune_cli.h"

namespace symprune::app {
namespace {

void add_prune(CLI::App& app) {
  auto options = std::make_shared<PruneCliOptions>();
  CLI::App* sub = app.add_subcommand("prune", "Prune a model layer by layer and write the pruned model");
  add_prune_options(sub, *options);
  sub->callback([options] {
    const engine::PruneConfig config = parsed_prune_config(*options);
    print_prune_result(config, engine::prune_model(config));
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(prune, symprune::app::add_prune);
