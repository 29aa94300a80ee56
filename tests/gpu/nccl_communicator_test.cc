// The NCCL communicator on one GPU with the local communicator as bootstrap: every collective must
// round-trip host data through the device exactly. Compiled in every configuration; skips without
// NCCL or without a device (the no-device / no-NCCL errors are unit-tested in communicator_test).
#include "dist/nccl_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "core/accel.h"
#include "core/error.h"

namespace symprune::dist {
namespace {

using ::testing::HasSubstr;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!compiled_with_nccl()) GTEST_SKIP() << "built without NCCL";
    if (accel::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << accel::unavailable_reason();
    bootstrap_ = make_local_communicator();
    comm_ = make_nccl_communicator(*bootstrap_, 0);
  }
  std::unique_ptr<Communicator> bootstrap_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclCommunicatorTest, SingleRankCollectivesAreExactCopies) {
  EXPECT_EQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);

  std::vector<double> d = {1.5, -2.25, 1e300};
  comm_->all_reduce_sum(d);
  EXPECT_EQ(d, (std::vector<double>{1.5, -2.25, 1e300}));
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.5f - 3.0f;
  const auto f_before = f;
  comm_->all_reduce_sum(f);
  EXPECT_EQ(f, f_before);
  std::vector<int64_t> n = {int64_t{1} << 40, -7};
  comm_->all_reduce_sum(n);
  EXPECT_EQ(n, (std::vector<int64_t>{int64_t{1} << 40, -7}));

  std::vector<std::byte> bytes = {std::byte{1}, std::byte{200}, std::byte{3}};
  comm_->broadcast(bytes, 0);
  EXPECT_EQ(bytes, (std::vector<std::byte>{std::byte{1}, std::byte{200}, std::byte{3}}));

  std::vector<std::byte> gathered(3);
  comm_->all_gather(bytes, gathered);
  EXPECT_EQ(gathered, bytes);
  const std::vector<int64_t> counts = {3};
  std::vector<std::byte> gathered_v(3);
  comm_->all_gather_v(bytes, counts, gathered_v);
  EXPECT_EQ(gathered_v, bytes);
  comm_->barrier();
}

// Messages beyond the fixed staging buffer (kNcclStagingBytes) pass in rounds, with the same results.
TEST_F(NcclCommunicatorTest, MessagesLargerThanTheStagingBufferPassInRounds) {
  const size_t large = kNcclStagingBytes + kNcclStagingBytes / 2 + 3;
  std::vector<std::byte> bytes(large);
  for (size_t i = 0; i < large; ++i) bytes[i] = static_cast<std::byte>((i * 7 + i / 4093) % 251);
  const auto before = bytes;
  comm_->broadcast(bytes, 0);
  EXPECT_EQ(bytes, before);
  std::vector<std::byte> gathered(large);
  comm_->all_gather(bytes, gathered);
  EXPECT_EQ(gathered, before);
  const std::vector<int64_t> counts = {static_cast<int64_t>(large)};
  std::vector<std::byte> gathered_v(large);
  comm_->all_gather_v(bytes, counts, gathered_v);
  EXPECT_EQ(gathered_v, before);
  std::vector<float> values(large / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 100003) - 5.5f;
  const auto values_before = values;
  comm_->all_reduce_sum(values);
  EXPECT_EQ(values, values_before);
}

TEST_F(NcclCommunicatorTest, RejectsBadArgumentsWithMessages) {
  std::vector<std::byte> bytes(4);
  try {
    comm_->broadcast(bytes, 1);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("broadcast: root 1 is not a rank of the nccl communicator (size 1)"));
  }
  std::vector<std::byte> small(3);
  try {
    comm_->all_gather(bytes, small);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather: output has 3 bytes, expected 4 (1 ranks x 4 bytes)"));
  }
}

}  // namespace
}  // namespace symprune::dist
