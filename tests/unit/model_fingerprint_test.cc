// model_fingerprint: equal for equal directories, different for other weights of the same shapes (a
// fine-tune), which a checkpoint must not resume on.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/fingerprint.h"
#include "support/test_support.h"

namespace symprune::model {
namespace {

namespace fs = std::filesystem;

class ModelFingerprintTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("symprune_fp_"); }
  void TearDown() override { fs::remove_all(dir_); }

  // config.json and one safetensors file of one fp32 tensor of `floats` values, all `value`, but for
  // `changed_index` (if in range) which holds `changed_value`.
  void write_model(int64_t floats, float value, int64_t changed_index = -1, float changed_value = 0.0f) {
    std::ofstream(dir_ / "config.json") << R"({"model_type": "llama"})";
    const std::string header = R"({"w":{"dtype":"F32","shape":[)" + std::to_string(floats) +
                               R"(],"data_offsets":[0,)" + std::to_string(floats * 4) + "]}}";
    std::ofstream out(dir_ / "model.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t length = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
    out << header;
    for (int64_t i = 0; i < floats; ++i) {
      const float v = i == changed_index ? changed_value : value;
      out.write(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }

  fs::path dir_;
};

TEST_F(ModelFingerprintTest, EqualForEqualDirectoriesAndChangedByOtherWeightsOfTheSameShapes) {
  // 12 MiB of data: hashed whole.
  const int64_t floats = int64_t{3} << 20;
  write_model(floats, 0.5f);
  const std::string base = model_fingerprint(dir_);
  EXPECT_EQ(base.size(), 16u);
  write_model(floats, 0.5f);
  EXPECT_EQ(model_fingerprint(dir_), base);
  write_model(floats, 0.25f);  // every weight changed, as in a fine-tune
  EXPECT_NE(model_fingerprint(dir_), base);
  write_model(floats, 0.5f, 7, 1.0f);  // one weight in the first sample
  EXPECT_NE(model_fingerprint(dir_), base);
  write_model(floats, 0.5f, floats - 1, 1.0f);  // the last weight
  EXPECT_NE(model_fingerprint(dir_), base);
  // Up to 256 MiB of data is hashed whole: a weight between where samples would be counts too.
  write_model(floats, 0.5f, floats / 2 + 12345, 1.0f);
  EXPECT_NE(model_fingerprint(dir_), base);
}

TEST_F(ModelFingerprintTest, FilesShorterThanTheirHeaderAreHashedWithoutError) {
  std::ofstream(dir_ / "config.json") << "{}";
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << "abc";
  EXPECT_EQ(model_fingerprint(dir_).size(), 16u);
}

}  // namespace
}  // namespace symprune::model
