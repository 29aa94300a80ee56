// The checkpoint file (io/checkpoint_file.h) and the run identity (engine/checkpoint.h): rows written with
// pwrite at HDF5's offsets read back through HDF5 with their checksums, in any split; a flipped byte, a
// truncated file and another format are named; identity differences list every field.
#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "engine/checkpoint.h"

namespace symprune {
namespace {
namespace fs = std::filesystem;

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ckpt-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file with float rows [rows, 3, 4] written as two slabs (rows [0, split) and [split, rows)) and a
  // byte dataset of `bytes` bytes.
  fs::path write(int64_t rows, int64_t split, int64_t bytes) {
    const fs::path path = dir_ / "c.h5";
    const auto places = io::create_checkpoint_file(path, {io::kCheckpointVersion, 3, 7, "abc123"},
                                                   {{"hidden", io::CheckpointType::kFloat32, {rows, 3, 4}},
                                                    {"blob", io::CheckpointType::kUint8, {bytes}}});
    floats_.resize(static_cast<size_t>(rows * 12));
    std::iota(floats_.begin(), floats_.end(), 0.5f);
    bytes_.resize(static_cast<size_t>(bytes));
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<std::byte>(i * 7 + 1);
    const int fd = ::open(path.c_str(), O_WRONLY);
    EXPECT_GE(fd, 0);
    const auto all = std::as_bytes(std::span<const float>(floats_));
    // Second slab first: the order of the ranks' writes does not matter.
    io::write_checkpoint_units(fd, path, places.at("hidden"), split,
                               all.subspan(static_cast<size_t>(split * 48)));
    io::write_checkpoint_units(fd, path, places.at("hidden"), 0, all.first(static_cast<size_t>(split * 48)));
    io::write_checkpoint_units(fd, path, places.at("blob"), 0, bytes_);
    ::close(fd);
    return path;
  }

  fs::path dir_;
  std::vector<float> floats_;
  std::vector<std::byte> bytes_;
};

TEST_F(CheckpointFileTest, RowsWrittenInSlabsReadBackInAnyOtherSplit) {
  const fs::path path = write(5, 2, (1 << 20) + 100);  // the byte dataset spans two checksum units
  const io::CheckpointReader reader(path);
  EXPECT_EQ(reader.header().next_block, 3);
  EXPECT_EQ(reader.header().blocks, 7);
  EXPECT_EQ(reader.header().run_id, "abc123");
  EXPECT_EQ(reader.dataset_names(), (std::vector<std::string>{"blob", "hidden"}));
  EXPECT_EQ(reader.shape("hidden"), (std::vector<int64_t>{5, 3, 4}));
  const auto rows = engine::read_checkpoint_rows(reader, "hidden", {5, 3, 4}, 1, 3);
  EXPECT_EQ(rows, std::vector<float>(floats_.begin() + 12, floats_.begin() + 48));
  std::vector<std::byte> blob(bytes_.size());
  reader.read_units("blob", 0, blob);
  EXPECT_EQ(blob, bytes_);
  EXPECT_FALSE(reader.verify("hidden"));
  EXPECT_FALSE(reader.verify("blob"));
  EXPECT_THROW(engine::read_checkpoint_rows(reader, "hidden", {6, 3, 4}, 0, 1), Error);
}

TEST_F(CheckpointFileTest, AFlippedByteIsNamedByDatasetAndUnit) {
  const fs::path path = write(4, 1, 10);
  int64_t offset = 0;
  {
    // Find row 2's first value in the file and flip one bit of it.
    std::ifstream in(path, std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    float value = floats_[24];
    offset = static_cast<int64_t>(data.find(std::string(reinterpret_cast<const char*>(&value), 4)));
    ASSERT_GT(offset, 0);
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x04;
    f.seekp(offset);
    f.write(&c, 1);
  }
  const io::CheckpointReader reader(path);
  const auto problem = reader.verify("hidden");
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("dataset hidden is corrupt: checksum mismatch in unit 2"), std::string::npos)
      << *problem;
  EXPECT_NO_THROW(engine::read_checkpoint_rows(reader, "hidden", {4, 3, 4}, 0, 2));  // rows 0..1 are fine
  EXPECT_THROW(engine::read_checkpoint_rows(reader, "hidden", {4, 3, 4}, 2, 1), Error);
}

TEST_F(CheckpointFileTest, TruncatedAndForeignFilesAreRefusedWithTheReason) {
  const fs::path path = write(4, 2, 10);
  fs::resize_file(path, fs::file_size(path) / 2);
  try {
    io::CheckpointReader reader(path);
    FAIL() << "a truncated file was opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a readable HDF5 file (truncated or corrupt?)"),
              std::string::npos);
  }
  EXPECT_FALSE(io::peek_checkpoint_header(path));
  std::ofstream(dir_ / "text.h5") << "hello";
  EXPECT_THROW(io::CheckpointReader(dir_ / "text.h5"), Error);
  EXPECT_THROW(io::CheckpointReader(dir_ / "missing.h5"), Error);
}

TEST_F(CheckpointFileTest, WhatIsNotAFileIsNamedForWhatItIs) {
  const auto error_of = [](const fs::path& path) {
    try {
      io::CheckpointReader reader(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(dir_ / "missing.h5"), "checkpoint " + (dir_ / "missing.h5").string() + ": no such file");
  fs::create_symlink("/dev/zero", dir_ / "zero.h5");  // it exists: "no such file" misled
  EXPECT_EQ(error_of(dir_ / "zero.h5"),
            "checkpoint " + (dir_ / "zero.h5").string() +
                ": not a regular file (a device or socket, through a symbolic link)");
  fs::create_directory(dir_ / "dir.h5");
  EXPECT_EQ(error_of(dir_ / "dir.h5"),
            "checkpoint " + (dir_ / "dir.h5").string() + ": not a regular file (a directory)");
}

TEST(RunIdentity, DifferencesNameEveryFieldAndIgnoreWhatMayChange) {
  const nlohmann::json a = {
      {"method", "wanda"}, {"sparsity", 0.5}, {"threads", 2}, {"out", "x"}, {"ranks", 1}};
  nlohmann::json b = a;
  b["threads"] = 8;
  b["out"] = "y";
  b["ranks"] = 4;
  const auto fp = nlohmann::json{{"model", "m1"}};
  EXPECT_FALSE(engine::identity_difference(engine::run_identity(a, fp), engine::run_identity(b, fp)));
  b["sparsity"] = 0.6;
  b["method"] = "ria";
  const auto diff =
      engine::identity_difference(engine::run_identity(a, fp), engine::run_identity(b, {{"model", "m2"}}));
  ASSERT_TRUE(diff);
  EXPECT_EQ(*diff,
            "config.method: the checkpoint has \"wanda\", this run has \"ria\"; config.sparsity: the "
            "checkpoint has "
            "0.5, this run has 0.6; fingerprints.model: the checkpoint has \"m1\", this run has \"m2\"");
}

}  // namespace
}  // namespace symprune
