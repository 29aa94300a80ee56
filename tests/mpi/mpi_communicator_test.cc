// The MPI communicator and the ordered reductions on real ranks: run by ctest as
// `mpirun -n 3 mpi_communicator_test` (and -n 1, -n 4). Every rank runs every test; the verdict is agreed
// across ranks (a failure on any rank fails all), so ctest sees one answer.
#include "dist/mpi_communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "dist/partition.h"
#include "engine/ordered_reduce.h"

namespace symprune {
namespace {

dist::MpiCommunicator* g_comm = nullptr;

TEST(MpiCommunicator, RankAndSize) {
  EXPECT_GE(g_comm->size(), 1);
  EXPECT_GE(g_comm->rank(), 0);
  EXPECT_LT(g_comm->rank(), g_comm->size());
  EXPECT_EQ(g_comm->name(), "mpi");
  EXPECT_GE(g_comm->local_rank(), 0);
  EXPECT_LT(g_comm->local_rank(), g_comm->local_size());
}

TEST(MpiCommunicator, AllReduceSumsExactly) {
  const int r = g_comm->rank(), n = g_comm->size();
  std::vector<int64_t> ints = {r, 1, int64_t{1} << 40};
  g_comm->all_reduce_sum(ints);
  EXPECT_EQ(ints[0], int64_t{n} * (n - 1) / 2);
  EXPECT_EQ(ints[1], n);
  EXPECT_EQ(ints[2], int64_t{n} << 40);
  std::vector<double> d = {0.5 * r, 2.0};
  g_comm->all_reduce_sum(d);
  EXPECT_EQ(d[0], 0.5 * n * (n - 1) / 2);  // small halves: exact in any order
  EXPECT_EQ(d[1], 2.0 * n);
  std::vector<float> f = {1.0f};
  g_comm->all_reduce_sum(f);
  EXPECT_EQ(f[0], static_cast<float>(n));
}

TEST(MpiCommunicator, BroadcastAndGathers) {
  const int r = g_comm->rank(), n = g_comm->size();
  for (int root = 0; root < n; ++root) {
    std::vector<std::byte> bytes(5, std::byte{0});
    if (r == root)
      for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<std::byte>(root * 10 + static_cast<int>(i));
    g_comm->broadcast(bytes, root);
    for (size_t i = 0; i < bytes.size(); ++i)
      EXPECT_EQ(bytes[i], static_cast<std::byte>(root * 10 + static_cast<int>(i)));
  }
  const std::vector<std::byte> mine(3, static_cast<std::byte>(r));
  std::vector<std::byte> all(3 * static_cast<size_t>(n));
  g_comm->all_gather(mine, all);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all[static_cast<size_t>(3 * p + i)], static_cast<std::byte>(p));
  // Uneven: rank p contributes p bytes (rank 0 none).
  std::vector<int64_t> counts(static_cast<size_t>(n));
  std::iota(counts.begin(), counts.end(), 0);
  const std::vector<std::byte> part(static_cast<size_t>(r), static_cast<std::byte>(r + 1));
  std::vector<std::byte> gathered(static_cast<size_t>(n) * (n - 1) / 2);
  g_comm->all_gather_v(part, counts, gathered);
  size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < p; ++i) EXPECT_EQ(gathered[at++], static_cast<std::byte>(p + 1));
}

TEST(MpiCommunicator, SendRecvInOrder) {
  const int r = g_comm->rank(), n = g_comm->size();
  if (n == 1) {
    std::vector<std::byte> b(1);
    EXPECT_THROW(g_comm->send(b, 0), Error);
    return;
  }
  // A ring: each rank sends two messages to the next, which receives them in order.
  std::vector<int64_t> first = {r, 100 + r}, second = {1000 + r};
  std::vector<int64_t> got_first(2), got_second(1);
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  if (r % 2 == 0) {
    g_comm->send(std::as_bytes(std::span<const int64_t>(first)), next);
    g_comm->send(std::as_bytes(std::span<const int64_t>(second)), next);
    g_comm->recv(std::as_writable_bytes(std::span<int64_t>(got_first)), previous);
    g_comm->recv(std::as_writable_bytes(std::span<int64_t>(got_second)), previous);
  } else {
    g_comm->recv(std::as_writable_bytes(std::span<int64_t>(got_first)), previous);
    g_comm->recv(std::as_writable_bytes(std::span<int64_t>(got_second)), previous);
    g_comm->send(std::as_bytes(std::span<const int64_t>(first)), next);
    g_comm->send(std::as_bytes(std::span<const int64_t>(second)), next);
  }
  EXPECT_EQ(got_first, (std::vector<int64_t>{previous, 100 + previous}));
  EXPECT_EQ(got_second, (std::vector<int64_t>{1000 + previous}));
  std::vector<std::byte> b(1);
  EXPECT_THROW(g_comm->send(b, r), Error);  // not to itself
  EXPECT_THROW(g_comm->recv(b, n), Error);  // not a rank
}

// The ordered sums must equal one process adding every chunk's partial in chunk order, for any split.
std::vector<double> chunk_partial(int64_t chunk, size_t length) {
  std::vector<double> v(length);
  for (size_t i = 0; i < length; ++i)
    v[i] = 1.0 / static_cast<double>(3 + chunk * 7 + static_cast<int64_t>(i)) * 1e-3 +
           (chunk % 3 == 0 ? 1e8 : 0.0);
  return v;
}

TEST(OrderedReduce, GatheredSumsEqualOneProcessBitForBit) {
  const int r = g_comm->rank(), n = g_comm->size();
  constexpr int64_t kChunks = 7;
  constexpr size_t kLength = 5;
  std::vector<double> expected(kLength, 0.0);
  for (int64_t c = 0; c < kChunks; ++c) {
    const auto p = chunk_partial(c, kLength);
    for (size_t i = 0; i < kLength; ++i) expected[i] += p[i];
  }
  const dist::Range mine = dist::partition(kChunks, n, r);
  std::vector<double> local;
  for (int64_t c = mine.begin; c < mine.end; ++c) {
    const auto p = chunk_partial(c, kLength);
    local.insert(local.end(), p.begin(), p.end());
  }
  EXPECT_EQ(engine::ordered_sum(*g_comm, local, kLength), expected);
}

TEST(OrderedReduce, ChainEqualsOneProcessBitForBit) {
  const int r = g_comm->rank(), n = g_comm->size();
  constexpr int64_t kChunks = 9;
  constexpr size_t kLength = 6;
  auto partial = [](int64_t c) {
    std::vector<float> v(kLength);
    for (size_t i = 0; i < kLength; ++i)
      v[i] = 1.0f / static_cast<float>(1 + c + static_cast<int64_t>(i)) + (c == 4 ? 3e7f : 0.0f);
    return v;
  };
  std::vector<double> expected(kLength, 0.0);
  for (int64_t c = 0; c < kChunks; ++c) {
    const auto p = partial(c);
    for (size_t i = 0; i < kLength; ++i) expected[i] += static_cast<double>(p[i]);
  }
  engine::OrderedChain chain(*g_comm, kLength);
  const dist::Range mine = dist::partition(kChunks, n, r);
  for (int64_t c = mine.begin; c < mine.end; ++c) chain.add(partial(c));
  EXPECT_EQ(chain.finish(), expected);
}

}  // namespace
}  // namespace symprune

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = symprune::dist::make_mpi_communicator(&argc, &argv);
  symprune::g_comm = comm.get();
  if (comm->rank() != 0) {
    // Only rank 0 prints the summary; every rank still runs and checks everything.
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  std::vector<int64_t> verdict = {failed};
  comm->all_reduce_sum(verdict);  // the verdict agreed across ranks
  if (comm->rank() == 0 && verdict[0] > 0 && !failed)
    std::fprintf(stderr, "mpi_communicator_test: %lld other rank(s) failed\n",
                 static_cast<long long>(verdict[0]));
  return verdict[0] > 0 ? 1 : 0;
}
