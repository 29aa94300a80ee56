#pragma once
// A cheap identity for a model directory, recorded in reports so a result can be tied to its inputs.
#include <filesystem>
#include <string>

namespace symprune::model {

// 16 hex digits of a 64-bit FNV-1a hash over, in this order: the bytes of config.json, then for every
// *.safetensors file of the directory in name order: its file name, its size in bytes and its JSON
// header (the 8-byte length and the header text: tensor names, dtypes, shapes, offsets). Tensor data
// is not read, so the fingerprint is instant for any size, and it changes whenever the config, the
// tensor layout or any file size changes (not for an in-place edit of weight values of equal size).
std::string model_fingerprint(const std::filesystem::path& dir);

}  // namespace symprune::model
