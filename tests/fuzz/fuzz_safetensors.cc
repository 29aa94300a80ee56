// One safetensors file: header validation, then every tensor's bytes read and converted to fp32.
#include "fuzz_support.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path =
        symprune::fuzz::write_file(dir, "model.safetensors", symprune::fuzz::as_view(data, size));
    const auto file = symprune::io::SafetensorsFile::open(path);
    for (const auto& info : file.tensors()) {
      const auto bytes = file.bytes(info);
      if (bytes.size() != info.data_end - info.data_begin)
        symprune::fuzz::violated("bytes() size", info.name);
      if (file.find(info.name) != &info) symprune::fuzz::violated("find() of a listed tensor", info.name);
    }
    const auto model = symprune::io::SafetensorsModel::open_dir(dir);
    for (const auto& name : model.names()) {
      const auto shape = model.info(name).shape;
      const symprune::Tensor t = model.load_f32(name, &shape);
      if (t.numel() != model.info(name).numel()) symprune::fuzz::violated("load_f32 numel", name);
    }
  });
}
