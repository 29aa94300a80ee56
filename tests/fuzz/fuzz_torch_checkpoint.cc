// PyTorch checkpoint (pytorch_model.bin, torch.save's zip format): the input as a zip archive
// (read_zip_records), as a data.pkl (unpickle_state_dict), and as a whole checkpoint file and model
// directory, every tensor read.
#include <span>
#include <vector>

#include "core/dtype.h"
#include "fuzz_support.h"
#include "io/torch_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  symprune::fuzz::run_expecting_only_errors([&] {
    for (const auto& record : symprune::io::read_zip_records(bytes, "fuzz.zip"))
      if (record.offset > size || record.size > size - record.offset)
        symprune::fuzz::violated("read_zip_records: a record outside the archive", record.name);
  });
  symprune::fuzz::run_expecting_only_errors([&] {
    for (const auto& ref : symprune::io::unpickle_state_dict(bytes, "data.pkl")) {
      if (ref.shape.size() != ref.stride.size())
        symprune::fuzz::violated("unpickle_state_dict: sizes and strides of different lengths", ref.name);
      if (ref.storage.empty() || ref.storage.find_first_of("/\\") != std::string::npos)
        symprune::fuzz::violated("unpickle_state_dict: a storage key that is not a record name", ref.storage);
    }
  });
  symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path =
        symprune::fuzz::write_file(dir, symprune::io::kTorchSingleFile, symprune::fuzz::as_view(data, size));
    const auto file = symprune::io::TorchCheckpointFile::open(path);
    std::vector<std::byte> out;
    for (const auto& info : file.tensors()) {
      if (file.find(info.name) != &info) symprune::fuzz::violated("find() of a listed tensor", info.name);
      if (info.data_begin > info.data_end || info.data_end > size)
        symprune::fuzz::violated("a tensor's data span outside the file", info.name);
      file.read_bytes(info, out);
      if (out.size() != static_cast<size_t>(info.numel() * symprune::dtype_size(info.dtype)))
        symprune::fuzz::violated("read_bytes() size", info.name);
    }
    const auto model = symprune::io::TorchModel::open_dir(dir);
    for (const auto& name : model->names()) {
      const auto& info = model->info(name);
      if (!symprune::is_weight_dtype(info.dtype)) continue;  // callers check dtypes before load_f32
      const symprune::Tensor t = model->load_f32(name, &info.shape);
      if (t.numel() != info.numel()) symprune::fuzz::violated("load_f32 numel", name);
    }
    for (const auto& shard : model->shards())
      if (shard.file != "model.safetensors") symprune::fuzz::violated("shard name", shard.file);
  });
  return 0;
}
