#pragma once
// A cheap identity for a model directory, recorded in reports so a result can be tied to its inputs.
#include <filesystem>
#include <string>

#include "io/model_resolver.h"

namespace symprune::model {

// 16 hex digits of a 64-bit FNV-1a hash over, in this order: the bytes of config.json, then for every
// *.safetensors file of the directory in name order: its file name, its size in bytes and its JSON
// header (the 8-byte length and the header text: tensor names, dtypes, shapes, offsets), then its tensor
// data: all of it in a file of up to 256 MiB of data, else samples: 4 KiB at every 16 MiB from the data's
// start, and its last 4 KiB. That is about 3 MB read for a 7B model, so the fingerprint is quick for any
// size, and it changes whenever the config, the tensor layout, any file size or the weights (a fine-tune
// of the same shapes) change. In a larger file, an in-place edit of a few weights between two samples goes
// unseen. A directory read as a PyTorch checkpoint hashes the files it is read from instead
// (io::torch_weight_files: pytorch_model.bin, or the index and its shards, subdirectories included), each
// by name, size and contents sampled the same way from its start.
std::string model_fingerprint(const std::filesystem::path& dir);
// A resolved model's: the directory's as above, or a synthetic model's canonical name (it is generated).
std::string model_fingerprint(const io::ResolvedModel& resolved);

}  // namespace symprune::model
