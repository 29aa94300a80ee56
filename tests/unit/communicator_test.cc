// Semantics of the size-1 communicator: identity collectives, exact copies, and the same argument
// checks (with precise messages) that the multi-rank implementations make.
#include "dist/communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/accel.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "support/error_text.h"

namespace symprune::dist {
namespace {

using test::error_of;
using ::testing::HasSubstr;

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

TEST(LocalCommunicator, IdentityAndName) {
  auto comm = make_local_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "local");
  comm->barrier();  // a no-op with one rank; must not block
}

TEST(LocalCommunicator, AllReduceSumLeavesValuesBitExact) {
  auto comm = make_local_communicator();
  std::vector<double> d = {1.5, -0.0, std::numeric_limits<double>::denorm_min(), 1e300};
  const auto d_before = d;
  comm->all_reduce_sum(d);
  ASSERT_EQ(d.size(), d_before.size());
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(std::signbit(d[i]), std::signbit(d_before[i])) << i;
  EXPECT_EQ(d, d_before);

  std::vector<float> f = {3.25f, -7.0f, 0.1f};
  comm->all_reduce_sum(f);
  EXPECT_EQ(f, (std::vector<float>{3.25f, -7.0f, 0.1f}));

  std::vector<int64_t> i = {std::numeric_limits<int64_t>::max(), -1, 0};
  comm->all_reduce_sum(i);
  EXPECT_EQ(i, (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), -1, 0}));

  std::vector<double> empty;
  EXPECT_NO_THROW(comm->all_reduce_sum(std::span<double>(empty)));
}

TEST(LocalCommunicator, BroadcastFromRootZeroKeepsBytes) {
  auto comm = make_local_communicator();
  auto data = bytes_of({1, 2, 255});
  comm->broadcast(data, 0);
  EXPECT_EQ(data, bytes_of({1, 2, 255}));
}

TEST(LocalCommunicator, BroadcastRejectsRootOutsideCommunicator) {
  auto comm = make_local_communicator();
  auto data = bytes_of({1});
  try {
    comm->broadcast(data, 1);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("broadcast: root 1 is not a rank of the local communicator (size 1)"));
  }
  EXPECT_THROW(comm->broadcast(data, -1), Error);
  EXPECT_EQ(data, bytes_of({1}));
}

TEST(LocalCommunicator, AllGatherCopiesInRankOrder) {
  auto comm = make_local_communicator();
  const auto local = bytes_of({9, 8, 7, 6});
  std::vector<std::byte> gathered(4, std::byte{0});
  comm->all_gather(local, gathered);
  EXPECT_EQ(gathered, local);
}

TEST(LocalCommunicator, AllGatherRejectsWrongOutputSize) {
  auto comm = make_local_communicator();
  const auto local = bytes_of({9, 8, 7});
  std::vector<std::byte> gathered(2);
  try {
    comm->all_gather(local, gathered);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather: output has 2 bytes, expected 3 (1 rank x 3 bytes)"));
  }
}

TEST(LocalCommunicator, AllGatherVCopiesAndChecksCounts) {
  auto comm = make_local_communicator();
  const auto local = bytes_of({4, 5});
  std::vector<std::byte> gathered(2);
  const std::vector<int64_t> counts = {2};
  comm->all_gather_v(local, counts, gathered);
  EXPECT_EQ(gathered, local);

  const std::vector<int64_t> two_ranks = {2, 2};
  try {
    comm->all_gather_v(local, two_ranks, gathered);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather_v: 2 counts given for a communicator of size 1"));
  }
  const std::vector<int64_t> wrong_count = {3};
  try {
    comm->all_gather_v(local, wrong_count, gathered);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather_v: rank 0 contributes 2 bytes but counts[0] is 3"));
  }
  std::vector<std::byte> too_big(5);
  try {
    comm->all_gather_v(local, counts, too_big);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_gather_v: output has 5 bytes, expected 2"));
  }
}

// One rank, rounds of 8 bytes: the gathers and the broadcast still copy whole messages, sums keep their
// values, and the argument checks are the inner communicator's.
TEST(ChunkedCommunicator, OneRankInRoundsOfEightBytes) {
  auto comm = make_chunked_communicator(make_local_communicator(), 8);
  EXPECT_EQ(comm->name(), "local");
  EXPECT_EQ(comm->size(), 1);
  std::vector<std::byte> part(21);
  for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<std::byte>(3 * i + 1);
  std::vector<std::byte> gathered(part.size());
  comm->all_gather(part, gathered);
  EXPECT_EQ(gathered, part);
  std::vector<std::byte> gathered_v(part.size());
  const std::vector<int64_t> counts = {21};
  comm->all_gather_v(part, counts, gathered_v);
  EXPECT_EQ(gathered_v, part);
  auto copy = part;
  comm->broadcast(copy, 0);
  EXPECT_EQ(copy, part);
  std::vector<double> values = {1.5, -2.0, 1e300, 0.1, 7.0};
  comm->all_reduce_sum(values);
  EXPECT_EQ(values, (std::vector<double>{1.5, -2.0, 1e300, 0.1, 7.0}));
  EXPECT_THAT(error_of([&] { comm->all_gather(part, std::span<std::byte>(gathered).first(20)); }),
              HasSubstr("all_gather: output has 20 bytes, expected 21 (1 rank x 21 bytes)"));
  EXPECT_THAT(error_of([&] { comm->broadcast(copy, 1); }), HasSubstr("root 1 is not a rank"));
  EXPECT_THROW(comm->send(part, 0), Error);
  EXPECT_THAT(error_of([] { make_chunked_communicator(make_local_communicator(), 7); }),
              HasSubstr("messages of at most 7 bytes cannot hold"));
}

// Without NCCL built in, or without a device, asking for the NCCL communicator is a clear error
// (with a device it is exercised by tests/gpu/nccl_communicator_test.cc).
TEST(NcclCommunicatorAvailability, ExplainsWhyItCannotBeCreated) {
  auto bootstrap = make_local_communicator();
  if (!compiled_with_nccl()) {
    try {
      make_nccl_communicator(*bootstrap, 0);
      FAIL() << "expected symprune::Error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("the NCCL communicator is not available: built without NCCL"));
    }
    return;
  }
  if (accel::device_count() > 0) GTEST_SKIP() << "a device is present: covered by the gpu tests";
  try {
    make_nccl_communicator(*bootstrap, 0);
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA error at "));
    EXPECT_THAT(e.what(), HasSubstr("cudaSetDevice(device)"));
  }
}

}  // namespace
}  // namespace symprune::dist
