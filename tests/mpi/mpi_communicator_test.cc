// The MPI communicator, the ordered reductions and a checkpoint's masks on real ranks: run by ctest as
// `mpirun -n 3 mpi_communicator_test` (and -n 1, -n 4). Every rank runs every test; the verdict is agreed
// across ranks (a failure on any rank fails all), so ctest sees one answer.
#include "dist/mpi_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/partition.h"
#include "engine/checkpoint.h"
#include "engine/ordered_reduce.h"
#include "engine/pruned_model_writer.h"
#include "io/checkpoint_file.h"
#include "io/synthetic_model.h"

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

void expect_gathered_sums_equal_one_process(dist::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
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
  EXPECT_EQ(engine::ordered_sum(comm, local, kLength), expected);
}

void expect_chain_equals_one_process(dist::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
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
  engine::OrderedChain chain(comm, kLength);
  const dist::Range mine = dist::partition(kChunks, n, r);
  for (int64_t c = mine.begin; c < mine.end; ++c) chain.add(partial(c));
  EXPECT_EQ(chain.finish(), expected);
}

TEST(OrderedReduce, GatheredSumsEqualOneProcessBitForBit) {
  expect_gathered_sums_equal_one_process(*g_comm);
}

TEST(OrderedReduce, ChainEqualsOneProcessBitForBit) {
  expect_chain_equals_one_process(*g_comm);
}

// A checkpoint's masks on real ranks. LLaMA-2-7B in bf16 is three shards; two matrices of each are masked
// (2 MiB and 5.375 MiB of bits). Each rank writes the bits of those it keeps (the tensors in the shards it
// writes) as a segment of its own, back to back in name order from a checksum unit's start. Read back with
// this rank count, and by rank 0 as each rank of 1, 2 and R + 1 ranks would (a resume with another count),
// every mask comes back bit for bit, on the rank that keeps it.
TEST(MpiCheckpoint, MasksSavedByTheirKeepersReadBackWithAnyRankCount) {
  namespace fs = std::filesystem;
  const io::SyntheticModel source(io::parse_synthetic_spec("synthetic:llama2-7b"));
  const auto shards = source.shards();
  ASSERT_EQ(shards.size(), 3u);
  std::map<std::string, engine::PackedMask> all;
  uint32_t seed = 0;
  for (const auto& shard : shards) {
    int taken = 0;
    for (const auto& name : shard.tensors) {
      const auto& shape = source.info(name).shape;
      if (shape.size() != 2 || name.find(".layers.") == std::string::npos || taken == 2) continue;
      ++taken;
      engine::PackedMask m{shape[0], shape[1], {}};
      m.bits.resize(static_cast<size_t>(engine::ModelMasks::Shape{m.rows, m.cols}.bytes()));
      std::mt19937 random(++seed);  // the same bits on every rank
      for (auto& byte : m.bits) byte = static_cast<uint8_t>(random());
      all.emplace(name, std::move(m));
    }
  }
  const int ranks = g_comm->size(), rank = g_comm->rank();
  engine::ModelMasks masks(source, rank, ranks);
  for (const auto& [name, m] : all) masks.add(name, m);

  // A directory every rank sees: rank 0's, by name.
  std::string dir =
      rank == 0 ? (fs::temp_directory_path() / ("symprune_mpi_masks_" + std::to_string(::getpid()))).string()
                : std::string();
  if (rank == 0) fs::create_directories(dir);
  int64_t length = static_cast<int64_t>(dir.size());
  g_comm->broadcast(std::as_writable_bytes(std::span<int64_t>(&length, 1)), 0);
  dir.resize(static_cast<size_t>(length));
  g_comm->broadcast(std::as_writable_bytes(std::span<char>(dir.data(), dir.size())), 0);
  const fs::path file = fs::path(dir) / "run.h5";
  const nlohmann::json identity = {{"test", "masks"}};
  {
    engine::Checkpointer writer(*g_comm, file, 1, 4, "run-masks");
    writer.start(2, {{"identity", identity}}, masks, {});
    writer.finish();
  }
  const auto nothing_else = [](const io::CheckpointReader&) {};
  engine::ModelMasks read(source, rank, ranks);
  ASSERT_TRUE(engine::load_resume_point(*g_comm, "auto", file, identity, read, nothing_else));
  EXPECT_EQ(read.shapes().size(), all.size());
  EXPECT_EQ(read.kept().size(), masks.kept().size());
  for (const auto& [name, m] : masks.kept()) EXPECT_EQ(read.kept().at(name).bits, m.bits) << name;

  if (rank == 0) {
    const io::CheckpointReader reader(file);
    std::vector<std::byte> state(static_cast<size_t>(reader.shape("state").at(0)));
    reader.read_units("state", 0, state);
    const auto index =
        nlohmann::json::parse(std::string(reinterpret_cast<const char*>(state.data()), state.size()))
            .at("masks");
    ASSERT_EQ(index.size(), all.size());
    std::vector<int64_t> next(static_cast<size_t>(ranks), -1);  // where each rank's next mask must lie
    for (const auto& entry : index) {                           // name order
      const auto name = entry.at("name").get<std::string>();
      const int keeper = masks.keeper(name);
      int64_t& at = next[static_cast<size_t>(keeper)];
      const auto offset = entry.at("offset").get<int64_t>();
      if (at < 0) {
        EXPECT_EQ(offset % io::kByteUnit, 0) << name;
      } else {
        EXPECT_EQ(offset, at) << name;
      }
      at = offset + all.at(name).bits.size();
    }
    const auto local = dist::make_local_communicator();
    for (const int count : {1, 2, ranks + 1}) {
      size_t found = 0;
      for (int q = 0; q < count; ++q) {
        engine::ModelMasks as(source, q, count);
        ASSERT_TRUE(engine::load_resume_point(*local, "auto", file, identity, as, nothing_else));
        for (const auto& [name, m] : as.kept()) EXPECT_EQ(m.bits, all.at(name).bits) << name << " " << q;
        found += as.kept().size();
      }
      EXPECT_EQ(found, all.size()) << count << " ranks";
    }
    fs::remove_all(dir);
  }
  g_comm->barrier();
}

// The MPI communicator seen through make_chunked_communicator (which owns what it wraps), recording the
// largest message each collective passes on.
class RecordingCommunicator final : public dist::Communicator {
 public:
  explicit RecordingCommunicator(dist::Communicator& inner, size_t* largest)
      : inner_(inner), largest_(largest) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  void all_reduce_sum(std::span<double> v) override { inner_.all_reduce_sum(seen(v)); }
  void all_reduce_sum(std::span<float> v) override { inner_.all_reduce_sum(seen(v)); }
  void all_reduce_sum(std::span<int64_t> v) override { inner_.all_reduce_sum(seen(v)); }
  void broadcast(std::span<std::byte> b, int root) override { inner_.broadcast(seen(b), root); }
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) override {
    inner_.all_gather(local, seen(gathered));
  }
  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    inner_.all_gather_v(local, counts, seen(gathered));
  }
  void send(std::span<const std::byte> b, int dest) override { inner_.send(seen(b), dest); }
  void recv(std::span<std::byte> b, int source) override { inner_.recv(seen(b), source); }
  void barrier() override { inner_.barrier(); }
  [[noreturn]] void abort(int exit_code) override {
    inner_.abort(exit_code);
    std::abort();  // not reached
  }

 private:
  template <typename T>
  std::span<T> seen(std::span<T> message) {
    *largest_ = std::max(*largest_, message.size_bytes());
    return message;
  }
  dist::Communicator& inner_;
  size_t* largest_;
};

uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>((rank * 37 + static_cast<int>(i % 1000) * 7 + 1) % 251);
}

// Every collective in rounds of at most the limit (down to one byte per rank and one 8-byte value) gives
// the results of the whole messages, and no message passed on exceeds the limit.
TEST(ChunkedCommunicator, RoundsGiveTheWholeMessagesResults) {
  const int r = g_comm->rank(), n = g_comm->size();
  for (const size_t limit : {size_t{8}, size_t{13}, size_t{64}, size_t{1} << 20}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    size_t largest = 0;
    auto comm =
        dist::make_chunked_communicator(std::make_unique<RecordingCommunicator>(*g_comm, &largest), limit);
    EXPECT_EQ(comm->name(), "mpi");
    EXPECT_EQ(comm->rank(), r);

    std::vector<int64_t> ints(100);
    std::vector<double> doubles(37);
    std::vector<float> floats(41);
    for (size_t i = 0; i < ints.size(); ++i) ints[i] = r * 1000 + static_cast<int64_t>(i);
    for (size_t i = 0; i < doubles.size(); ++i) doubles[i] = r + 0.5 * static_cast<double>(i);
    for (size_t i = 0; i < floats.size(); ++i)
      floats[i] = static_cast<float>(r) + 0.25f * static_cast<float>(i);
    comm->all_reduce_sum(ints);
    comm->all_reduce_sum(doubles);
    comm->all_reduce_sum(floats);
    const int64_t rank_sum = int64_t{n} * (n - 1) / 2;
    for (size_t i = 0; i < ints.size(); ++i)
      ASSERT_EQ(ints[i], 1000 * rank_sum + n * static_cast<int64_t>(i));
    for (size_t i = 0; i < doubles.size(); ++i)
      ASSERT_EQ(doubles[i], static_cast<double>(rank_sum) + n * 0.5 * static_cast<double>(i));
    for (size_t i = 0; i < floats.size(); ++i)
      ASSERT_EQ(floats[i],
                static_cast<float>(rank_sum) + static_cast<float>(n) * 0.25f * static_cast<float>(i));

    for (int root = 0; root < n; ++root) {
      std::vector<std::byte> bytes(101, std::byte{0});
      if (r == root)
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(pattern(root, i));
      comm->broadcast(bytes, root);
      for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<std::byte>(pattern(root, i)));
    }

    const auto part_of = [](int rank, size_t length) {
      std::vector<std::byte> part(length);
      for (size_t i = 0; i < length; ++i) part[i] = static_cast<std::byte>(pattern(rank, i));
      return part;
    };
    constexpr size_t kPart = 37;
    std::vector<std::byte> all(kPart * static_cast<size_t>(n));
    comm->all_gather(part_of(r, kPart), all);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < kPart; ++i)
        ASSERT_EQ(all[static_cast<size_t>(p) * kPart + i], static_cast<std::byte>(pattern(p, i)));

    // Uneven parts, rank 0's empty: rank p gives 11p + 3(p mod 2) bytes.
    std::vector<int64_t> counts(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) counts[static_cast<size_t>(p)] = 11 * p + 3 * (p % 2);
    std::vector<std::byte> gathered(
        static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0})));
    comm->all_gather_v(part_of(r, static_cast<size_t>(counts[static_cast<size_t>(r)])), counts, gathered);
    size_t at = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < static_cast<size_t>(counts[static_cast<size_t>(p)]); ++i)
        ASSERT_EQ(gathered[at++], static_cast<std::byte>(pattern(p, i)));

    if (n > 1) {  // a ring, as SendRecvInOrder: 29 bytes to the next rank, twice
      const int next = (r + 1) % n, previous = (r + n - 1) % n;
      std::vector<std::byte> first(29), second(29);
      const auto mine = part_of(r, 29);
      if (r % 2 == 0) {
        comm->send(mine, next);
        comm->send(mine, next);
        comm->recv(first, previous);
        comm->recv(second, previous);
      } else {
        comm->recv(first, previous);
        comm->recv(second, previous);
        comm->send(mine, next);
        comm->send(mine, next);
      }
      EXPECT_EQ(first, part_of(previous, 29));
      EXPECT_EQ(second, part_of(previous, 29));
    }
    // The ordered sums of the pipeline's statistics (gathered partials, the chain of running totals).
    expect_gathered_sums_equal_one_process(*comm);
    expect_chain_equals_one_process(*comm);
    EXPECT_LE(largest, limit);
    if (limit < 32) EXPECT_GT(largest, 0u);
  }
  EXPECT_THROW(dist::make_chunked_communicator(std::make_unique<RecordingCommunicator>(*g_comm, nullptr), 7),
               Error);
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
