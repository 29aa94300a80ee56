// safetensors reading and writing: exact round trips, the on-disk layout, and every corrupt-input
// error the reader promises (each asserting the message names the file and the problem).
#include "io/safetensors.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("symprune_st_"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i, n >>= 8) s[i] = static_cast<char>(n & 0xff);
  return s;
}

// A safetensors file built by hand: length prefix (or `length_override`), header text, data bytes.
std::string raw_file(const std::string& header, const std::string& data,
                     std::optional<uint64_t> length_override = std::nullopt) {
  return le64(length_override.value_or(header.size())) + header + data;
}

// Expects `fn` to throw symprune::Error whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

struct Sample {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;  // exactly representable in `dtype`
  std::vector<std::byte> bytes;
};

Sample make_sample(std::string name, DType dtype, std::vector<int64_t> shape, float scale) {
  Sample s{std::move(name), dtype, std::move(shape), {}, {}};
  const int64_t n = shape_numel(s.shape);
  for (int64_t i = 0; i < n; ++i)
    s.values.push_back(scale * static_cast<float>(i - n / 2) / 8.0f);  // k/8: exact
  s.bytes.resize(static_cast<size_t>(n * dtype_size(dtype)));
  if (n > 0) convert_from_f32(dtype, s.values.data(), s.bytes.data(), n);
  return s;
}

std::vector<TensorToWrite> to_write(const std::vector<Sample>& samples) {
  std::vector<TensorToWrite> out;
  for (const auto& s : samples) out.push_back({s.name, s.dtype, s.shape, s.bytes});
  return out;
}

std::vector<Sample> three_dtypes() {
  return {make_sample("a.f32", DType::kF32, {3, 5}, 1.0f),
          make_sample("b.f16", DType::kF16, {4, 2, 3}, -2.0f), make_sample("c.bf16", DType::kBF16, {7}, 0.5f),
          make_sample("d.scalar", DType::kF32, {}, 3.0f), make_sample("e.empty", DType::kBF16, {0, 4}, 1.0f)};
}

void expect_model_matches(const SafetensorsModel& model, const std::vector<Sample>& samples) {
  ASSERT_EQ(model.names().size(), samples.size());
  for (const auto& s : samples) {
    SCOPED_TRACE(s.name);
    ASSERT_TRUE(model.contains(s.name));
    const TensorInfo& info = model.info(s.name);
    EXPECT_EQ(info.dtype, s.dtype);
    EXPECT_EQ(info.shape, s.shape);
    const auto bytes = model.bytes(s.name);
    ASSERT_EQ(bytes.size(), s.bytes.size());
    if (!bytes.empty()) EXPECT_EQ(std::memcmp(bytes.data(), s.bytes.data(), bytes.size()), 0);
    const Tensor t = model.load_f32(s.name);
    EXPECT_EQ(t.shape(), s.shape);
    ASSERT_EQ(t.numel(), static_cast<int64_t>(s.values.size()));
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], s.values[static_cast<size_t>(i)]);
  }
}

std::vector<std::string> dir_listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------------------------------------
// Round trips and layout

TEST_F(SafetensorsTest, SingleFileRoundTripAllDtypes) {
  const auto samples = three_dtypes();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"symprune", "test"}};
  const auto written = write_safetensors_sharded(dir_, to_write(samples), meta, 1ull << 30);
  EXPECT_EQ(written, std::vector<std::string>{"model.safetensors"});
  const auto model = SafetensorsModel::open_dir(dir_);
  EXPECT_FALSE(model.sharded());
  expect_model_matches(model, samples);
  EXPECT_EQ(model.metadata(), meta);
  EXPECT_EQ(model.weight_map().at("b.f16"), "model.safetensors");
  // Atomic write: only the final file remains, no temporary.
  EXPECT_EQ(dir_listing(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, FileLayoutIsByteExact) {
  const auto samples = three_dtypes();
  write_safetensors(dir_ / "x.safetensors", to_write(samples), {{"format", "pt"}});
  const std::string bytes = read_bytes(dir_ / "x.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "data section must start 8-byte aligned";
  std::string data;
  for (const auto& s : samples) data.append(reinterpret_cast<const char*>(s.bytes.data()), s.bytes.size());
  ASSERT_EQ(bytes.size(), 8 + n + data.size());
  EXPECT_EQ(bytes.substr(8 + n), data);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.f32"]["dtype"], "F32");
  EXPECT_EQ(header["a.f32"]["data_offsets"], nlohmann::json({0, 60}));
  EXPECT_EQ(header["b.f16"]["dtype"], "F16");
  EXPECT_EQ(header["b.f16"]["shape"], nlohmann::json({4, 2, 3}));
  EXPECT_EQ(header["b.f16"]["data_offsets"], nlohmann::json({60, 108}));
  EXPECT_EQ(header["c.bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["d.scalar"]["shape"], nlohmann::json::array());
  // Tensors come back in offset order.
  const auto file = SafetensorsFile::open(dir_ / "x.safetensors");
  ASSERT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.tensors()[0].name, "a.f32");
  EXPECT_EQ(file.tensors()[1].name, "b.f16");
  EXPECT_EQ(file.find("nope"), nullptr);
}

TEST_F(SafetensorsTest, ShardedRoundTripWithIndex) {
  std::vector<Sample> samples;
  for (int i = 0; i < 6; ++i) {
    const DType dt = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kF16 : DType::kBF16);
    samples.push_back(make_sample("layer." + std::to_string(i) + ".weight", dt, {8, 4}, 1.0f + i));
  }
  // F32 tensors are 128 bytes, 16-bit ones 64: a 150-byte limit forces several shards.
  const auto written = write_safetensors_sharded(dir_, to_write(samples), {{"format", "pt"}}, 150);
  ASSERT_GE(written.size(), 3u);
  EXPECT_EQ(written.back(), "model.safetensors.index.json");
  EXPECT_EQ(written.front(), fmt::format("model-00001-of-{:05d}.safetensors", written.size() - 1));
  const auto index = nlohmann::json::parse(read_bytes(dir_ / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 2 * 128 + 4 * 64);
  EXPECT_EQ(index["weight_map"].size(), 6u);

  const auto model = SafetensorsModel::open_dir(dir_);
  EXPECT_TRUE(model.sharded());
  expect_model_matches(model, samples);
  EXPECT_EQ(model.metadata().at("format"), "pt");
  const auto wm = model.weight_map();
  for (const auto& [tensor, shard] : index["weight_map"].items())
    EXPECT_EQ(wm.at(tensor), shard.get<std::string>());
  EXPECT_EQ(written.size(), 5u);  // greedy: [128], [64, 64], [128], [64, 64] + index
  EXPECT_EQ(model.file_of("layer.0.weight").path(), dir_ / "model-00001-of-00004.safetensors");
  EXPECT_EQ(wm.at("layer.2.weight"), "model-00002-of-00004.safetensors");

  // Each shard respects the limit (no shard holds more than 150 bytes of data).
  for (size_t i = 0; i + 1 < written.size(); ++i) {
    const auto f = SafetensorsFile::open(dir_ / written[i]);
    uint64_t total = 0;
    for (const auto& t : f.tensors()) total += t.data_end - t.data_begin;
    EXPECT_LE(total, 150u);
  }
  // No temporaries left behind.
  for (const auto& name : dir_listing(dir_)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;

  // Re-saving unsharded replaces the index (transformers would otherwise mix the two).
  write_safetensors_sharded(dir_, to_write(samples), {}, 1ull << 30);
  EXPECT_EQ(dir_listing(dir_), std::vector<std::string>{"model.safetensors"});
  expect_model_matches(SafetensorsModel::open_dir(dir_), samples);
  // And re-saving sharded removes the single file.
  write_safetensors_sharded(dir_, to_write(samples), {}, 150);
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  expect_model_matches(SafetensorsModel::open_dir(dir_), samples);
}

// The Hugging Face cache stores files in blobs/ and links them from snapshots/<rev>/.
TEST_F(SafetensorsTest, SymlinkedShardsAsInTheHfCache) {
  std::vector<Sample> samples = {make_sample("a", DType::kF32, {8}, 1.0f),
                                 make_sample("b", DType::kF16, {8}, 1.0f)};
  const fs::path staging = dir_ / "staging";
  const auto written = write_safetensors_sharded(staging, to_write(samples), {}, 32);
  ASSERT_EQ(written.size(), 3u);
  const fs::path snapshot = dir_ / "snapshots" / "rev";
  fs::create_directories(snapshot);
  fs::create_directories(dir_ / "blobs");
  for (const auto& name : written) {
    fs::rename(staging / name, dir_ / "blobs" / name);
    fs::create_symlink(fs::path("..") / ".." / "blobs" / name, snapshot / name);
  }
  const auto model = SafetensorsModel::open_dir(snapshot);
  expect_model_matches(model, samples);
  EXPECT_EQ(model.weight_map().at("b"), "model-00002-of-00002.safetensors");
}

TEST_F(SafetensorsTest, TensorLargerThanShardLimitGetsItsOwnShard) {
  std::vector<Sample> samples = {make_sample("small", DType::kF32, {2}, 1.0f),
                                 make_sample("big", DType::kF32, {64}, 1.0f),
                                 make_sample("small2", DType::kF32, {2}, 1.0f)};
  const auto written = write_safetensors_sharded(dir_, to_write(samples), {}, 16);
  EXPECT_EQ(written.size(), 4u);  // three shards + index
  const auto model = SafetensorsModel::open_dir(dir_);
  EXPECT_EQ(model.weight_map().at("big"), "model-00002-of-00003.safetensors");
  expect_model_matches(model, samples);
}

TEST_F(SafetensorsTest, LoadF32ChecksExpectedShape) {
  write_safetensors(dir_ / "model.safetensors", to_write({make_sample("w", DType::kF16, {2, 3}, 1.0f)}), {});
  const auto model = SafetensorsModel::open_dir(dir_);
  const std::vector<int64_t> good = {2, 3};
  EXPECT_EQ(model.load_f32("w", &good).shape(), good);
  const std::vector<int64_t> bad = {3, 2};
  expect_error([&] { model.load_f32("w", &bad); },
               {"tensor 'w'", (dir_ / "model.safetensors").string(), "[2, 3]", "[3, 2]"});
  expect_error([&] { model.load_f32("missing.weight"); }, {"missing tensor 'missing.weight'", dir_.string()});
  expect_error([&] { model.info("missing.weight"); }, {"missing tensor 'missing.weight'"});
}

// Cross-check with the reference implementation when the test Python is available.
TEST_F(SafetensorsTest, InteroperatesWithPythonSafetensors) {
  const fs::path python = symprune::testing::python_executable();
  if (!fs::exists(python)) GTEST_SKIP() << "no test Python (set SYMPRUNE_PYTHON)";
  const auto samples = three_dtypes();
  write_safetensors(dir_ / "ours.safetensors", to_write(samples), {{"format", "pt"}});
  const fs::path script = dir_ / "check.py";
  write_bytes(script, R"PY(
import sys, torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open
d = sys.argv[1]
t = load_file(d + "/ours.safetensors")
assert t["a.f32"].dtype == torch.float32 and list(t["a.f32"].shape) == [3, 5]
assert t["b.f16"].dtype == torch.float16 and list(t["b.f16"].shape) == [4, 2, 3]
assert t["c.bf16"].dtype == torch.bfloat16
assert t["d.scalar"].shape == torch.Size([]) and t["e.empty"].shape == torch.Size([0, 4])
n = 15
assert torch.equal(t["a.f32"].flatten(), torch.tensor([(i - n // 2) / 8.0 for i in range(n)]))
with safe_open(d + "/ours.safetensors", "pt") as f:
    assert f.metadata() == {"format": "pt"}
save_file({"x": torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16),
           "y": torch.tensor([1.5, -2.25], dtype=torch.float16)}, d + "/theirs.safetensors", metadata={"k": "v"})
)PY");
  const std::string cmd = python.string() + " " + script.string() + " " + dir_.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto file = SafetensorsFile::open(dir_ / "theirs.safetensors");
  EXPECT_EQ(file.metadata().at("k"), "v");
  ASSERT_NE(file.find("x"), nullptr);
  EXPECT_EQ(file.find("x")->dtype, DType::kBF16);
  EXPECT_EQ(file.find("x")->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> x(6);
  convert_to_f32(DType::kBF16, file.bytes(*file.find("x")).data(), x.data(), 6);
  EXPECT_EQ(x, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  std::vector<float> y(2);
  convert_to_f32(DType::kF16, file.bytes(*file.find("y")).data(), y.data(), 2);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.25f}));
}

// ---------------------------------------------------------------------------------------------
// Writer errors

TEST_F(SafetensorsTest, WriterRejectsBadInputAndLeavesNothing) {
  std::vector<std::byte> bytes(10);
  expect_error(
      [&] {
        write_safetensors(dir_ / "model.safetensors", {{"w", DType::kF32, {2, 2}, bytes}}, {});
      },
      {(dir_ / "model.safetensors").string(), "tensor 'w'", "needs 16 bytes but 10 were given"});
  std::vector<std::byte> ok(16);
  expect_error(
      [&] {
        write_safetensors(dir_ / "model.safetensors",
                          {{"w", DType::kF32, {2, 2}, ok}, {"w", DType::kF32, {2, 2}, ok}}, {});
      },
      {"duplicate tensor name 'w'"});
  expect_error(
      [&] {
        write_safetensors(dir_ / "model.safetensors", {{"__metadata__", DType::kF32, {4}, ok}}, {});
      },
      {"'__metadata__' is reserved"});
  EXPECT_TRUE(dir_listing(dir_).empty());
  expect_error([&] { write_safetensors(dir_ / "no" / "such" / "model.safetensors", {}, {}); },
               {(dir_ / "no" / "such" / "model.safetensors").string(), "directory", "does not exist"});
}

TEST_F(SafetensorsTest, OverwriteIsAtomicReplacement) {
  write_safetensors(dir_ / "m.safetensors", to_write({make_sample("a", DType::kF32, {4}, 1.0f)}), {});
  write_safetensors(dir_ / "m.safetensors", to_write({make_sample("b", DType::kF16, {2}, 1.0f)}), {});
  const auto file = SafetensorsFile::open(dir_ / "m.safetensors");
  ASSERT_EQ(file.tensors().size(), 1u);
  EXPECT_EQ(file.tensors()[0].name, "b");
  EXPECT_EQ(dir_listing(dir_), std::vector<std::string>{"m.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Corrupt files

class CorruptSafetensorsTest : public SafetensorsTest {
 protected:
  // Writes `bytes` as model.safetensors and expects open_dir to fail with all of `parts` (plus the path).
  void expect_corrupt(const std::string& bytes, std::vector<std::string> parts) {
    const fs::path path = dir_ / "model.safetensors";
    write_bytes(path, bytes);
    parts.push_back(path.string());
    expect_error([&] { SafetensorsModel::open_dir(dir_); }, parts);
    expect_error([&] { SafetensorsFile::open(path); }, parts);
  }
};

TEST_F(CorruptSafetensorsTest, ValidBaselineOpens) {
  write_bytes(dir_ / "model.safetensors",
              raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_TRUE(SafetensorsModel::open_dir(dir_).contains("w"));
}

TEST_F(CorruptSafetensorsTest, FileShorterThanLengthPrefix) {
  expect_corrupt("abc", {"truncated safetensors file: 3 bytes"});
  expect_corrupt("", {"truncated safetensors file: 0 bytes"});
}

TEST_F(CorruptSafetensorsTest, HeaderLengthPastEndOfFile) {
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "", 4096),
                 {"header length 4096 runs past the end"});
}

TEST_F(CorruptSafetensorsTest, HeaderLargerThanCap) {
  expect_corrupt(raw_file("{}", "", kMaxSafetensorsHeaderBytes + 1),
                 {"header length 104857601 exceeds the 104857600-byte limit"});
  expect_corrupt(raw_file("{}", "", ~0ull), {"exceeds the 104857600-byte limit"});
}

TEST_F(CorruptSafetensorsTest, TruncatedData) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  expect_corrupt(raw_file(header, std::string(10, '\0')),
                 {"tensor 'w'", "run past the end of the data section"});
}

TEST_F(CorruptSafetensorsTest, BadJson) {
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32",)", ""), {"invalid JSON"});
  expect_corrupt(raw_file(R"(["not an object"])", ""), {"expected a JSON object"});
  expect_corrupt(raw_file(std::string(200, '[') + std::string(200, ']'), ""), {"expected a JSON object"});
  expect_corrupt(raw_file("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", ""),
                 {"nesting deeper than 64 levels"});
  expect_corrupt(raw_file(R"({"w":"F32"})", ""), {"tensor 'w'", "must be an object"});
  expect_corrupt(raw_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                 {"missing or non-string dtype"});
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
                 {"missing or non-array shape"});
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, '\0')),
                 {"data_offsets must be an array [begin, end]"});
  expect_corrupt(
      raw_file(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", std::string(4, '\0')),
      {"shape entries must be non-negative integers"});
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                 {"negative shape entry -1"});
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", std::string(4, '\0')),
                 {"data_offsets must be non-negative integers"});
  expect_corrupt(raw_file(R"({"__metadata__":{"k":1}})", ""),
                 {"__metadata__ value for 'k' must be a string"});
}

TEST_F(CorruptSafetensorsTest, OverlappingOffsets) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_corrupt(raw_file(header, std::string(12, '\0')), {"tensors 'a' [0, 8] and 'b' [4, 12] overlap"});
}

TEST_F(CorruptSafetensorsTest, OffsetsPastEndOrReversed) {
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", std::string(8, '\0')),
                 {"data_offsets [8, 16] run past the end of the data section (8 bytes"});
  expect_corrupt(raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0')),
                 {"data_offsets [8, 0] end before they begin"});
  expect_corrupt(
      raw_file(
          R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,18446744073709551615]}})",
          ""),
      {"run past the end"});
}

TEST_F(CorruptSafetensorsTest, ShapeTimesDtypeMustEqualByteLength) {
  expect_corrupt(raw_file(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                 {"tensor 'w'", "shape [3] x BF16 needs 6 bytes but data_offsets [0, 8] span 8 bytes"});
  // Shapes whose element count overflows 64 bits are refused, not wrapped.
  expect_corrupt(
      raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
      {"tensor 'w'", "overflows"});
}

TEST_F(CorruptSafetensorsTest, UnknownDtype) {
  expect_corrupt(raw_file(R"({"q":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
                 {"tensor 'q'", "unknown safetensors dtype 'Q4_K'"});
  // Sub-byte dtypes have no whole-byte element size: refused the same way.
  expect_corrupt(raw_file(R"({"q":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", std::string(1, '\0')),
                 {"tensor 'q'", "unknown safetensors dtype 'F4'"});
}

// Tensors a model does not use (position_ids in I64, inv_freq in F64, ...) are read as opaque bytes;
// converting one to fp32 is refused with the dtype named.
TEST_F(SafetensorsTest, NonWeightDtypesAreReadAsBytes) {
  const std::pair<const char*, int> dtypes[] = {
      {"F64", 8}, {"I64", 8}, {"U64", 8},  {"I32", 4},     {"U32", 4},     {"I16", 2},    {"U16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, width] : dtypes) {
    const size_t begin = data.size();
    for (int i = 0; i < 3 * width; ++i) data.push_back(static_cast<char>(begin + i));
    header[std::string("t.") + name] = {
        {"dtype", name}, {"shape", {3}}, {"data_offsets", {begin, data.size()}}};
  }
  write_bytes(dir_ / "model.safetensors", raw_file(header.dump(), data));
  const auto model = SafetensorsModel::open_dir(dir_);
  for (const auto& [name, width] : dtypes) {
    SCOPED_TRACE(name);
    const std::string tensor = std::string("t.") + name;
    const TensorInfo& info = model.info(tensor);
    EXPECT_EQ(dtype_name(info.dtype), name);
    EXPECT_EQ(dtype_size(info.dtype), width);
    EXPECT_FALSE(is_weight_dtype(info.dtype));
    const auto bytes = model.bytes(tensor);
    ASSERT_EQ(bytes.size(), static_cast<size_t>(3 * width));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
              data.substr(static_cast<size_t>(info.data_begin), bytes.size()));
    expect_error([&] { model.load_f32(tensor); },
                 {(dir_ / "model.safetensors").string(), "tensor '" + tensor + "'",
                  std::string("unsupported dtype ") + name + " (supported: F32, F16, BF16)"});
  }
  // And the writer writes them back unchanged (the pruned-model writer copies them this way).
  std::vector<TensorToWrite> tensors;
  const auto file = SafetensorsFile::open(dir_ / "model.safetensors");
  for (const auto& info : file.tensors())
    tensors.push_back({info.name, info.dtype, info.shape, file.bytes(info)});
  write_safetensors(dir_ / "copy.safetensors", tensors, {});
  const auto copy = SafetensorsFile::open(dir_ / "copy.safetensors");
  for (const auto& info : copy.tensors()) {
    const auto a = copy.bytes(info);
    const auto b = model.bytes(info.name);
    EXPECT_EQ(dtype_name(info.dtype), dtype_name(model.info(info.name).dtype));
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << info.name;
  }
}

// A header length whose low bytes are 80 02..05 begins like a protocol-2..5 pickle; such files (about 1
// in 2048 headers) are valid safetensors and must open. The JSON is padded with spaces to the length.
TEST_F(SafetensorsTest, HeaderLengthThatBeginsLikeAPickleOpens) {
  const auto samples = three_dtypes();
  for (const uint64_t length : {0x0280ull, 0x0380ull, 0x0480ull, 0x0580ull, 0x10280ull, 0x20580ull}) {
    SCOPED_TRACE(length);
    write_safetensors(dir_ / "model.safetensors", to_write(samples), {{"format", "pt"}});
    std::string bytes = read_bytes(dir_ / "model.safetensors");
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
    ASSERT_LE(header_length, length);
    const std::string header = bytes.substr(8, header_length) + std::string(length - header_length, ' ');
    bytes = raw_file(header, bytes.substr(8 + header_length));
    ASSERT_EQ(static_cast<unsigned char>(bytes[0]), 0x80);
    ASSERT_GE(static_cast<unsigned char>(bytes[1]), 2);
    ASSERT_LE(static_cast<unsigned char>(bytes[1]), 5);
    write_bytes(dir_ / "model.safetensors", bytes);
    expect_model_matches(SafetensorsModel::open_dir(dir_), samples);
  }
  // Sharded: every shard's header begins 80 02 / 80 03.
  fs::remove(dir_ / "model.safetensors");
  const auto written = write_safetensors_sharded(dir_, to_write(samples), {}, 64);
  ASSERT_GT(written.size(), 2u);
  uint64_t length = 0x0280;
  for (const auto& name : written) {
    if (!name.ends_with(".safetensors")) continue;
    std::string bytes = read_bytes(dir_ / name);
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
    bytes = raw_file(bytes.substr(8, header_length) + std::string(length - header_length, ' '),
                     bytes.substr(8 + header_length));
    write_bytes(dir_ / name, bytes);
    length += 0x100;
  }
  expect_model_matches(SafetensorsModel::open_dir(dir_), samples);
}

TEST_F(CorruptSafetensorsTest, PickleFileRefusedWithConversionHint) {
  const std::string zip = std::string("PK\x03\x04", 4) + std::string(60, 'x');
  write_bytes(dir_ / "weights.safetensors", zip);
  expect_error([&] { SafetensorsFile::open(dir_ / "weights.safetensors"); },
               {"PyTorch pickle checkpoint, not safetensors", "safe_serialization=True"});
  write_bytes(dir_ / "legacy.bin", std::string("\x80\x02", 2) + std::string(20, 'y'));
  expect_error([&] { SafetensorsFile::open(dir_ / "legacy.bin"); }, {"pickle"});
  // A pickle whose first bytes happen to frame a '{' is still not JSON: still the pickle diagnosis.
  write_bytes(dir_ / "framed.bin", std::string("\x80\x02\0\0\0\0\0\0{q\x00(X", 13) + std::string(700, 'y'));
  expect_error([&] { SafetensorsFile::open(dir_ / "framed.bin"); }, {"PyTorch pickle checkpoint"});
}

TEST_F(CorruptSafetensorsTest, MetadataMustBeAnObjectOfStrings) {
  expect_corrupt(raw_file(R"({"__metadata__":5})", ""), {"__metadata__ must be an object of strings"});
  // A null __metadata__ is tolerated (some writers emit it).
  write_bytes(dir_ / "model.safetensors", raw_file(R"({"__metadata__":null})", ""));
  EXPECT_TRUE(SafetensorsModel::open_dir(dir_).metadata().empty());
}

TEST_F(SafetensorsTest, OpenNonFiles) {
  expect_error([&] { SafetensorsFile::open(dir_ / "absent.safetensors"); },
               {(dir_ / "absent.safetensors").string(), "cannot open"});
  fs::create_directories(dir_ / "d.safetensors");
  expect_error([&] { SafetensorsFile::open(dir_ / "d.safetensors"); },
               {(dir_ / "d.safetensors").string(), "not a regular file"});
}

// Another process truncating a model file while a run has it mapped must give an error naming the file,
// not kill the run with SIGBUS.
TEST_F(SafetensorsTest, FileTruncatedAfterOpenIsAnErrorNotASigbus) {
  const std::vector<Sample> samples = {make_sample("a", DType::kF32, {16384}, 1.0f),
                                       make_sample("b", DType::kF32, {16384}, 1.0f)};
  const fs::path path = dir_ / "model.safetensors";
  write_safetensors(path, to_write(samples), {});
  const auto model = SafetensorsModel::open_dir(dir_);
  fs::resize_file(path, 4096);
  const std::string shrank = "the file shrank while it was being read (truncated or replaced during the run)";
  expect_error([&] { model.load_f32("b"); },
               {path.string(), shrank, "it now has 4096 bytes, tensor 'b' needs"});
  expect_error([&] { model.bytes("a"); }, {path.string(), shrank, "tensor 'a'"});
  // Grown back (rewritten in place), the data is readable again.
  write_safetensors(dir_ / "again.safetensors", to_write(samples), {});
  fs::resize_file(path, fs::file_size(dir_ / "again.safetensors"));
  EXPECT_EQ(model.load_f32("b").numel(), 16384);
}

// The check before each read leaves a window before the copy; a SIGBUS there becomes an Error as well,
// on any thread, and the guard leaves no trace for the next read.
TEST_F(SafetensorsTest, ReadMappedTurnsSigbusIntoAnError) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const fs::path path = dir_ / "data.bin";
  write_bytes(path, std::string(4 * page, 'x'));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const auto* bytes = static_cast<const volatile char*>(map);
  fs::resize_file(path, page);
  const auto touch = [&](size_t offset) {
    return [bytes, offset] {
      char sink = 0;
      for (size_t i = 0; i < 64; ++i) sink = static_cast<char>(sink + bytes[offset + i]);
      (void)sink;
    };
  };
  EXPECT_NO_THROW(read_mapped(path, touch(0)));  // still inside the file
  expect_error([&] { read_mapped(path, touch(2 * page)); },
               {path.string(), "the file shrank while it was being read"});
  std::string from_thread;
  std::thread worker([&] {
    try {
      read_mapped(path, touch(3 * page));
    } catch (const Error& e) {
      from_thread = e.what();
    }
  });
  worker.join();
  EXPECT_THAT(from_thread, HasSubstr("the file shrank while it was being read"));
  // Nested guards: the inner one catches, the outer one stays armed.
  expect_error(
      [&] {
        read_mapped(path, [&] {
          EXPECT_THROW(read_mapped(path, touch(2 * page)), Error);
          touch(3 * page)();
        });
      },
      {"the file shrank"});
  EXPECT_NO_THROW(read_mapped(path, touch(64)));
  ::munmap(map, 4 * page);
}

TEST_F(SafetensorsTest, ShardedWriterArgumentErrors) {
  const auto samples = three_dtypes();
  expect_error([&] { write_safetensors_sharded(dir_, to_write(samples), {}, 0); },
               {dir_.string(), "max shard size must be positive"});
  write_bytes(dir_ / "file", "x");
  expect_error([&] { write_safetensors_sharded(dir_ / "file" / "out", to_write(samples), {}, 1000); },
               {(dir_ / "file" / "out").string(), "cannot create the output directory"});
}

// ---------------------------------------------------------------------------------------------
// Directories and indexes

TEST_F(SafetensorsTest, DirectoryWithOnlyPickleWeightsIsRefused) {
  write_bytes(dir_ / "pytorch_model.bin", std::string("PK\x03\x04", 4));
  write_bytes(dir_ / "config.json", "{}");
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {dir_.string(), "found PyTorch pickle weights (pytorch_model.bin)", "save_pretrained",
                "safe_serialization=True"});
}

TEST_F(SafetensorsTest, DirectoryWithoutWeights) {
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {dir_.string(),
                "no model weights found: expected model.safetensors, model.safetensors.index.json, "
                "pytorch_model.bin or pytorch_model.bin.index.json"});
  expect_error([&] { SafetensorsModel::open_dir(dir_ / "absent"); }, {"model directory not found"});
  write_bytes(dir_ / "stray.safetensors", raw_file("{}", ""));
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {"found other .safetensors files (stray.safetensors"});
}

class IndexTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    write_safetensors(
        dir_ / "model-00001-of-00001.safetensors",
        to_write({make_sample("a", DType::kF32, {2}, 1.0f), make_sample("b", DType::kF16, {2}, 1.0f)}), {});
  }
  void write_index(const nlohmann::json& weight_map) {
    write_bytes(dir_ / "model.safetensors.index.json",
                nlohmann::json({{"metadata", {{"total_size", 12}}}, {"weight_map", weight_map}}).dump());
  }
  fs::path index_path() const { return dir_ / "model.safetensors.index.json"; }
};

TEST_F(IndexTest, ValidIndexOpens) {
  write_index({{"a", "model-00001-of-00001.safetensors"}, {"b", "model-00001-of-00001.safetensors"}});
  const auto model = SafetensorsModel::open_dir(dir_);
  EXPECT_TRUE(model.sharded());
  EXPECT_EQ(model.names(), (std::vector<std::string>{"a", "b"}));
  // "./" inside the directory is harmless and accepted.
  write_index({{"a", "./model-00001-of-00001.safetensors"}});
  EXPECT_TRUE(SafetensorsModel::open_dir(dir_).contains("a"));
}

TEST_F(IndexTest, ShardNameEscapingTheDirectoryIsRefused) {
  write_index({{"a", "../model-00001-of-00001.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {index_path().string(), "'../model-00001-of-00001.safetensors' leaves the model directory"});
  write_index({{"a", "sub/../../x.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); }, {"leaves the model directory"});
  write_index({{"a", (dir_ / "model-00001-of-00001.safetensors").string()}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); }, {index_path().string(), "is an absolute path"});
  write_index({{"a", ""}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); }, {"empty shard file name"});
  write_index({{"a", 3}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {"weight_map entry for 'a' must be a file name string"});
}

TEST_F(IndexTest, MissingShardOrTensorIsReported) {
  write_index({{"a", "model-00001-of-00001.safetensors"}, {"c", "model-00002-of-00002.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {index_path().string(), "shard 'model-00002-of-00002.safetensors' (holding 'c') not found"});
  write_index({{"a", "model-00001-of-00001.safetensors"}, {"zz", "model-00001-of-00001.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {"missing tensor 'zz'", "model-00001-of-00001.safetensors", index_path().string()});
}

TEST_F(IndexTest, MalformedIndex) {
  write_bytes(index_path(), "{\"weight_map\": ");
  expect_error([&] { SafetensorsModel::open_dir(dir_); }, {index_path().string(), "invalid JSON"});
  write_bytes(index_path(), R"({"metadata": {}})");
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {index_path().string(), "missing \"weight_map\" object"});
  write_index(nlohmann::json::object());
  expect_error([&] { SafetensorsModel::open_dir(dir_); }, {index_path().string(), "weight_map is empty"});
}

TEST_F(IndexTest, CorruptShardIsNamed) {
  write_bytes(dir_ / "model-00002-of-00002.safetensors", raw_file("{}", "", 1000));
  write_index({{"a", "model-00001-of-00001.safetensors"}, {"c", "model-00002-of-00002.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {(dir_ / "model-00002-of-00002.safetensors").string(), "runs past the end"});
}

TEST_F(IndexTest, OversizedIndexIsRefused) {
  // A sparse 65 MiB index: refused by size before anything is read.
  write_bytes(index_path(), "{");
  fs::resize_file(index_path(), (64ull << 20) + 1);
  expect_error([&] { SafetensorsModel::open_dir(dir_); },
               {index_path().string(), "file is 67108865 bytes, more than the 67108864 bytes accepted"});
}

}  // namespace
}  // namespace symprune::io
