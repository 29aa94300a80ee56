// A sharded model directory: model.safetensors.index.json and its shards. Input: the index, then each
// shard, separated by kPartSeparator; shard k of n (1-based) is written as model-0000k-of-0000n.safetensors,
// the Hugging Face naming the seeds use.
#include <fmt/format.h>

#include "fuzz_support.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto parts = symprune::fuzz::split_parts(symprune::fuzz::as_view(data, size));
    const auto dir = symprune::fuzz::fresh_dir();
    symprune::fuzz::write_file(dir, "model.safetensors.index.json", parts[0]);
    const size_t shards = parts.size() - 1;
    for (size_t k = 1; k <= shards; ++k)
      symprune::fuzz::write_file(dir, fmt::format("model-{:05d}-of-{:05d}.safetensors", k, shards), parts[k]);
    const auto model = symprune::io::SafetensorsModel::open_dir(dir);
    const auto weight_map = model.weight_map();
    for (const auto& name : model.names()) {
      if (!model.contains(name)) symprune::fuzz::violated("contains() of a listed tensor", name);
      const auto& file = model.file_of(name);
      // Shards must stay inside the model directory, whatever the index says.
      if (file.path().parent_path().lexically_normal() != dir.lexically_normal())
        symprune::fuzz::violated("shard outside the model directory:", file.path().string());
      (void)model.bytes(name);
      (void)model.load_f32(name);
    }
    (void)model.metadata();
  });
}
