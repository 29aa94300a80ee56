#pragma once
// The strict reading of a sharded checkpoint's index (model.safetensors.index.json or
// pytorch_model.bin.index.json), shared by the safetensors and PyTorch readers. (index_shard_names in
// safetensors.h is the lenient one, for fingerprints and footprints, which validates nothing.)
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/json_util.h"
#include "io/safetensors.h"

namespace symprune::io {

// The shards of an index, each opened once, and where each tensor is read from.
template <typename File>
struct IndexedShards {
  std::vector<std::string> names;  // each shard as the index names it, parallel to files
  std::vector<std::unique_ptr<File>> files;
  std::map<std::string, size_t, std::less<>> location;  // tensor name -> index into files
};

// Reads `index` in `dir`: its weight_map maps each tensor to a shard file name confined to the directory
// (check_confined_shard_name); each shard is opened once with File::open (names compared as paths: "x" and
// "./x" are one file, which would otherwise be written twice); every tensor is in the shard the index
// names. Then each shard's own tensors: one the index does not list is still the shard's (a warning: a
// pruned copy of the shard keeps it), one that two shards hold is refused (which copy a loader ends with
// depends on the order it reads them in).
template <typename File>
IndexedShards<File> read_indexed_shards(const std::filesystem::path& dir,
                                        const std::filesystem::path& index) {
  namespace fs = std::filesystem;
  const nlohmann::json json = read_json_file(index);
  SYMPRUNE_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
                 "{}: missing \"weight_map\" object", index.string());
  IndexedShards<File> out;
  std::error_code ec;
  std::map<std::string, size_t> file_index;  // normalized shard name -> index into files
  for (const auto& [tensor, shard_value] : json["weight_map"].items()) {
    SYMPRUNE_CHECK(shard_value.is_string(), "{}: weight_map entry for '{}' must be a file name string",
                   index.string(), tensor);
    const std::string shard = shard_value.template get<std::string>();
    check_confined_shard_name(shard, index);
    const std::string normal = fs::path(shard).lexically_normal().generic_string();
    auto it = file_index.find(normal);
    if (it == file_index.end()) {
      const fs::path shard_path = dir / shard;
      // A link whose target is missing: a Hugging Face cache snapshot whose blob was not downloaded.
      SYMPRUNE_CHECK(fs::exists(shard_path, ec), "{}: shard '{}' (holding '{}') not found: {} {}",
                     index.string(), shard, tensor, shard_path.string(),
                     fs::is_symlink(shard_path, ec)
                         ? fmt::format("is a symbolic link to {}, which does not exist",
                                       fs::read_symlink(shard_path, ec).string())
                         : std::string("does not exist"));
      out.files.push_back(std::make_unique<File>(File::open(shard_path)));
      out.names.push_back(shard);
      it = file_index.emplace(normal, out.files.size() - 1).first;
    }
    SYMPRUNE_CHECK(out.files[it->second]->find(tensor) != nullptr,
                   "{}: missing tensor '{}' in shard {} (listed in {})",
                   out.files[it->second]->path().string(), tensor, out.names[it->second], index.string());
    out.location.emplace(tensor, it->second);
  }
  SYMPRUNE_CHECK(!out.files.empty(), "{}: weight_map is empty", index.string());
  for (size_t i = 0; i < out.files.size(); ++i)
    for (const auto& info : out.files[i]->tensors()) {
      const auto [it, unlisted] = out.location.emplace(info.name, i);
      SYMPRUNE_CHECK(it->second == i,
                     "{}: tensor '{}' is stored in two shards, {} ({}) and {}: which copy is the model's is "
                     "ambiguous; remove one of them",
                     index.string(), info.name, out.files[it->second]->path().string(),
                     json["weight_map"].contains(info.name) ? "where the index places it"
                                                            : "the index lists it in neither",
                     out.files[i]->path().string());
      if (unlisted && log::is_root())
        log::warn(
            "{}: tensor '{}' is not listed in {}: read from this shard, and kept there in a pruned copy",
            out.files[i]->path().string(), info.name, index.string());
    }
  return out;
}

}  // namespace symprune::io
