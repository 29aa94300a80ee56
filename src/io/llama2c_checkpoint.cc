#include "io/llama2c_checkpoint.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <system_error>

#include "core/error.h"

namespace symprune::io {
namespace {

static_assert(std::endian::native == std::endian::little, "llama2.c files are little-endian");

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// Sizes come from untrusted headers: every product/sum is checked.
uint64_t checked_mul(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw Error("size that overflows 64 bits");
  return out;
}
uint64_t checked_add(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) throw Error("size that overflows 64 bits");
  return out;
}

int32_t read_i32(const unsigned char* bytes) {
  int32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

uint64_t checked_file_size(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  SYMPRUNE_CHECK(std::filesystem::exists(status), "cannot open llama2.c checkpoint '{}': no such file",
                 path.string());
  SYMPRUNE_CHECK(!ec, "cannot open llama2.c checkpoint '{}': {}", path.string(), ec.message());
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(status), "llama2.c checkpoint '{}' is not a regular file",
                 path.string());
  const uint64_t size = std::filesystem::file_size(path, ec);
  SYMPRUNE_CHECK(!ec, "cannot read the size of llama2.c checkpoint '{}': {}", path.string(), ec.message());
  return size;
}

FilePtr open_file(const std::filesystem::path& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  SYMPRUNE_CHECK(file != nullptr, "cannot open llama2.c checkpoint '{}': {}", path.string(),
                 std::strerror(errno));
  return file;
}

void read_exact(std::FILE* file, void* dst, uint64_t bytes, const std::filesystem::path& path) {
  const size_t got = std::fread(dst, 1, static_cast<size_t>(bytes), file);
  // The size was validated up front, so a short read means the file changed or the disk failed.
  SYMPRUNE_CHECK(got == bytes, "short read from llama2.c checkpoint '{}': wanted {} bytes, got {}",
                 path.string(), bytes, got);
}

Tensor read_tensor(std::FILE* file, std::vector<int64_t> shape, const std::filesystem::path& path) {
  Tensor tensor(std::move(shape));
  read_exact(file, tensor.data(), static_cast<uint64_t>(tensor.numel()) * sizeof(float), path);
  return tensor;
}

void read_layers(std::FILE* file, std::vector<Tensor>& out, int64_t n_layers,
                 const std::vector<int64_t>& shape, const std::filesystem::path& path) {
  out.clear();
  out.reserve(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) out.push_back(read_tensor(file, shape, path));
}

}  // namespace

uint64_t Llama2cHeader::expected_file_bytes() const {
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const uint64_t d = u(dim), h = u(hidden_dim), kv = u(kv_dim()), v = u(vocab_size);
  uint64_t per_layer = checked_add(d, checked_mul(d, d));                  // rms_att + wq
  per_layer = checked_add(per_layer, checked_mul(2, checked_mul(kv, d)));  // wk + wv
  per_layer = checked_add(per_layer, checked_add(checked_mul(d, d), d));   // wo + rms_ffn
  per_layer = checked_add(per_layer, checked_mul(3, checked_mul(h, d)));   // w1 + w2 + w3
  uint64_t floats = checked_add(checked_mul(v, d), checked_mul(u(n_layers), per_layer));
  floats = checked_add(floats, d);                                                          // rms_final
  if (version == 0) floats = checked_add(floats, checked_mul(u(seq_len), u(head_size())));  // cos + sin
  if (!shared_classifier) floats = checked_add(floats, checked_mul(v, d));
  return checked_add(header_bytes(), checked_mul(floats, sizeof(float)));
}

Llama2cHeader read_llama2c_header(const std::filesystem::path& path) {
  const std::string name = path.string();
  const uint64_t size = checked_file_size(path);
  SYMPRUNE_CHECK(size >= kLlama2cV0HeaderBytes,
                 "llama2.c checkpoint '{}' is truncated: {} bytes, shorter than the {}-byte header", name,
                 size, kLlama2cV0HeaderBytes);
  unsigned char bytes[kLlama2cV1HeaderBytes] = {};
  {
    FilePtr file = open_file(path);
    read_exact(file.get(), bytes, std::min<uint64_t>(size, sizeof bytes), path);
  }

  Llama2cHeader header;
  const unsigned char* fields = bytes;
  uint32_t magic;
  std::memcpy(&magic, bytes, sizeof magic);
  int32_t raw_vocab = 0;
  if (magic == kLlama2cMagic) {
    SYMPRUNE_CHECK(size >= kLlama2cV1HeaderBytes,
                   "llama2.c checkpoint '{}' is truncated: {} bytes, shorter than the {}-byte version header",
                   name, size, kLlama2cV1HeaderBytes);
    const int32_t version = read_i32(bytes + 4);
    SYMPRUNE_CHECK(
        version != 2,
        "llama2.c checkpoint '{}' is version 2 (Q8_0 quantized), which is not supported; export it "
        "with export.py --version 0 or --version 1 (fp32)",
        name);
    SYMPRUNE_CHECK(version == 1, "llama2.c checkpoint '{}' has unknown version {} (supported: 0 and 1)", name,
                   version);
    header.version = 1;
    fields = bytes + 8;
    const unsigned char shared = bytes[8 + 7 * 4];
    SYMPRUNE_CHECK(shared <= 1, "llama2.c checkpoint '{}': shared_classifier flag is {}, expected 0 or 1",
                   name, static_cast<int>(shared));
    header.shared_classifier = shared == 1;
    raw_vocab = read_i32(fields + 20);
    SYMPRUNE_CHECK(raw_vocab > 0,
                   "llama2.c checkpoint '{}': vocab_size is {}, expected > 0 in a version 1 file", name,
                   raw_vocab);
  } else {
    raw_vocab = read_i32(fields + 20);
    SYMPRUNE_CHECK(raw_vocab != 0, "llama2.c checkpoint '{}': vocab_size is 0", name);
    // The legacy format signals an unshared classifier with a negative vocab size.
    header.shared_classifier = raw_vocab > 0;
  }
  header.dim = read_i32(fields + 0);
  header.hidden_dim = read_i32(fields + 4);
  header.n_layers = read_i32(fields + 8);
  header.n_heads = read_i32(fields + 12);
  header.n_kv_heads = read_i32(fields + 16);
  header.vocab_size = std::abs(static_cast<int64_t>(raw_vocab));
  header.seq_len = read_i32(fields + 24);

  const std::pair<const char*, int64_t> positive[] = {
      {"dim", header.dim},         {"hidden_dim", header.hidden_dim}, {"n_layers", header.n_layers},
      {"n_heads", header.n_heads}, {"n_kv_heads", header.n_kv_heads}, {"seq_len", header.seq_len}};
  for (const auto& [field, value] : positive) {
    SYMPRUNE_CHECK(value > 0, "llama2.c checkpoint '{}': header field {} is {}, expected > 0", name, field,
                   value);
  }
  SYMPRUNE_CHECK(header.dim % header.n_heads == 0,
                 "llama2.c checkpoint '{}': n_heads {} does not divide dim {}", name, header.n_heads,
                 header.dim);
  SYMPRUNE_CHECK(header.n_kv_heads <= header.n_heads && header.n_heads % header.n_kv_heads == 0,
                 "llama2.c checkpoint '{}': n_kv_heads {} does not divide n_heads {}", name,
                 header.n_kv_heads, header.n_heads);
  SYMPRUNE_CHECK(header.head_size() % 2 == 0,
                 "llama2.c checkpoint '{}': head size {} (dim {} / n_heads {}) is odd; RoPE needs it even",
                 name, header.head_size(), header.dim, header.n_heads);

  uint64_t expected = 0;
  try {
    expected = header.expected_file_bytes();
  } catch (const Error& e) {
    fail(
        "llama2.c checkpoint '{}': the header (dim {}, hidden_dim {}, n_layers {}, vocab_size {}) implies a "
        "{}",
        name, header.dim, header.hidden_dim, header.n_layers, header.vocab_size, e.what());
  }
  SYMPRUNE_CHECK(
      size == expected,
      "llama2.c checkpoint '{}' has {} bytes but its version {} header (dim {}, hidden_dim {}, n_layers "
      "{}, n_heads {}, n_kv_heads {}, vocab_size {}, seq_len {}, {} classifier) implies {} bytes{}",
      name, size, header.version, header.dim, header.hidden_dim, header.n_layers, header.n_heads,
      header.n_kv_heads, header.vocab_size, header.seq_len, header.shared_classifier ? "shared" : "separate",
      expected, size < expected ? " (truncated?)" : " (trailing data)");
  return header;
}

Llama2cCheckpoint load_llama2c_checkpoint(const std::filesystem::path& path) {
  Llama2cCheckpoint ck;
  ck.header = read_llama2c_header(path);
  const Llama2cHeader& h = ck.header;
  FilePtr file = open_file(path);
  SYMPRUNE_CHECK(std::fseek(file.get(), static_cast<long>(h.header_bytes()), SEEK_SET) == 0,
                 "cannot seek in llama2.c checkpoint '{}': {}", path.string(), std::strerror(errno));
  std::FILE* f = file.get();
  const int64_t L = h.n_layers, dim = h.dim, kv = h.kv_dim(), hid = h.hidden_dim;
  if (h.version == 0) {
    ck.token_embedding = read_tensor(f, {h.vocab_size, dim}, path);
    read_layers(f, ck.rms_att, L, {dim}, path);
    read_layers(f, ck.wq, L, {dim, dim}, path);
    read_layers(f, ck.wk, L, {kv, dim}, path);
    read_layers(f, ck.wv, L, {kv, dim}, path);
    read_layers(f, ck.wo, L, {dim, dim}, path);
    read_layers(f, ck.rms_ffn, L, {dim}, path);
    read_layers(f, ck.w1, L, {hid, dim}, path);
    read_layers(f, ck.w2, L, {dim, hid}, path);
    read_layers(f, ck.w3, L, {hid, dim}, path);
    ck.rms_final = read_tensor(f, {dim}, path);
    ck.freq_cis_real = read_tensor(f, {h.seq_len, h.head_size() / 2}, path);
    ck.freq_cis_imag = read_tensor(f, {h.seq_len, h.head_size() / 2}, path);
  } else {
    // version1_export writes the norms first, then the matrices.
    read_layers(f, ck.rms_att, L, {dim}, path);
    read_layers(f, ck.rms_ffn, L, {dim}, path);
    ck.rms_final = read_tensor(f, {dim}, path);
    ck.token_embedding = read_tensor(f, {h.vocab_size, dim}, path);
    read_layers(f, ck.wq, L, {dim, dim}, path);
    read_layers(f, ck.wk, L, {kv, dim}, path);
    read_layers(f, ck.wv, L, {kv, dim}, path);
    read_layers(f, ck.wo, L, {dim, dim}, path);
    read_layers(f, ck.w1, L, {hid, dim}, path);
    read_layers(f, ck.w2, L, {dim, hid}, path);
    read_layers(f, ck.w3, L, {hid, dim}, path);
  }
  if (!h.shared_classifier) ck.wcls = read_tensor(f, {h.vocab_size, dim}, path);
  return ck;
}

void check_llama2c_rope_tables(const Llama2cCheckpoint& ck, const std::filesystem::path& path, double theta) {
  const Llama2cHeader& h = ck.header;
  if (h.version != 0) return;
  const int64_t half = h.head_size() / 2;
  SYMPRUNE_ASSERT(ck.freq_cis_real.numel() == h.seq_len * half &&
                  ck.freq_cis_imag.numel() == h.seq_len * half);
  for (int64_t p = 0; p < h.seq_len; ++p) {
    // export.py computes the angles in fp32, so the error grows with the position.
    const double tolerance = 1e-4 + 2e-6 * static_cast<double>(p);
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(h.head_size()));
      const double angle = static_cast<double>(p) * freq;
      const double cos_file = ck.freq_cis_real[p * half + i];
      const double sin_file = ck.freq_cis_imag[p * half + i];
      if (std::abs(cos_file - std::cos(angle)) <= tolerance &&
          std::abs(sin_file - std::sin(angle)) <= tolerance) {
        continue;
      }
      std::string implied;
      if (h.seq_len > 1 && half > 1) {
        const double angle1 = std::atan2(ck.freq_cis_imag[half + 1], ck.freq_cis_real[half + 1]);
        if (angle1 > 0 && angle1 < 1) {
          implied = fmt::format("; position 1 implies theta {:.6g}",
                                std::exp(-std::log(angle1) * static_cast<double>(h.head_size()) / 2.0));
        }
      }
      fail(
          "llama2.c checkpoint '{}': RoPE table disagrees with theta {} and head size {} at position {}, "
          "index {}: file cos {:.7g} sin {:.7g}, expected cos {:.7g} sin {:.7g}{}",
          path.string(), theta, h.head_size(), p, i, cos_file, sin_file, std::cos(angle), std::sin(angle),
          implied);
    }
  }
}

Tensor permute_rope_rows_to_hf(const Tensor& weight, int64_t n_heads) {
  SYMPRUNE_ASSERT(weight.rank() == 2 && n_heads > 0, "weight {} with {} heads", weight.shape_string(),
                  n_heads);
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  SYMPRUNE_ASSERT(rows % n_heads == 0 && (rows / n_heads) % 2 == 0, "{} rows, {} heads", rows, n_heads);
  const int64_t head = rows / n_heads, half = head / 2;
  Tensor out({rows, cols});
  for (int64_t hd = 0; hd < n_heads; ++hd) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        // view(n_heads, half, 2, cols).transpose(1, 2): output (h, j, i) takes input (h, i, j).
        const auto src = weight.row(hd * head + 2 * i + j);
        auto dst = out.row(hd * head + j * half + i);
        std::copy(src.begin(), src.end(), dst.begin());
      }
    }
  }
  return out;
}

}  // namespace symprune::io
