// Mask selection on device scores against core::select_mask on the host: the masks must be equal
// bit for bit, ties and special values included (the order is defined exactly, so there is no tolerance).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <span>
#include <thread>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/device_mask_selector.h"
#include "core/masks.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

using ::testing::HasSubstr;

Mask device_mask(const Tensor& scores, const MaskSpec& spec, std::string_view name = "m") {
  const cuda::DeviceArray<float> device_scores(scores.data(), scores.numel());
  return cuda::select_mask_on_device(device_scores.data(), scores.dim(0), scores.dim(1), spec, name);
}

void expect_same_mask(const Tensor& scores, const MaskSpec& spec) {
  const Mask expected = select_mask(scores, spec, "m");
  const Mask actual = device_mask(scores, spec);
  ASSERT_EQ(actual.rows(), expected.rows());
  ASSERT_EQ(actual.cols(), expected.cols());
  int64_t differing = 0;
  for (int64_t i = 0; i < expected.size(); ++i) differing += actual.flat()[i] != expected.flat()[i];
  EXPECT_EQ(differing, 0) << describe(spec) << " on " << scores.shape_string() << ": " << differing << " of "
                          << expected.size() << " entries differ";
  EXPECT_EQ(actual.count(), expected.count());
}

struct Shape {
  int64_t rows, cols;
};

// Widths below, at and above the block size, odd ones, and one above the shared-memory cache (11264).
const Shape kRowShapes[] = {{1, 1}, {3, 2}, {5, 7}, {4, 33}, {3, 256}, {6, 300}, {2, 1000}, {2, 11300}};

TEST_F(KernelTest, RowSelectionEqualsHostOnRandomScores) {
  uint32_t seed = 10;
  for (const auto& shape : kRowShapes)
    for (double rho : {0.0, 0.1, 0.5, 0.9}) {
      const Tensor scores({shape.rows, shape.cols}, uniform_values(shape.rows * shape.cols, seed++));
      expect_same_mask(scores, MaskSpec::row(rho));
    }
}

TEST_F(KernelTest, RowSelectionCutsTiesByColumn) {
  uint32_t seed = 20;
  for (const auto& shape : kRowShapes)
    for (double rho : {0.3, 0.5, 0.77}) {
      const Tensor scores({shape.rows, shape.cols}, tied_values(shape.rows * shape.cols, seed++, 3));
      expect_same_mask(scores, MaskSpec::row(rho));
    }
  // A row of one repeated value: the first k columns go.
  const Tensor same({2, 600}, std::vector<float>(1200, 0.5f));
  expect_same_mask(same, MaskSpec::row(0.5));
  const Mask mask = device_mask(same, MaskSpec::row(0.5));
  for (int64_t c = 0; c < 600; ++c) EXPECT_EQ(mask.pruned(1, c), c < 300) << c;
}

TEST_F(KernelTest, SpecialValuesOrderLikeTheHost) {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> values = {0.0f, -0.0f, inf, -inf, tiny, -tiny, 1e-30f, -1e30f, 3.0f, -0.0f, 0.0f, 2.0f};
  std::vector<float> row;
  for (int rep = 0; rep < 30; ++rep) row.insert(row.end(), values.begin(), values.end());
  const Tensor scores({3, 120}, std::vector<float>(row.begin(), row.begin() + 360));
  for (double rho : {0.1, 0.25, 0.5, 0.6, 0.95}) {
    expect_same_mask(scores, MaskSpec::row(rho));
    expect_same_mask(scores, MaskSpec::layer(rho));
    expect_same_mask(scores, MaskSpec::layer(rho, true));
  }
  expect_same_mask(scores, MaskSpec::nm(2, 4));
  expect_same_mask(scores, MaskSpec::nm(5, 12));
}

TEST_F(KernelTest, NmSelectionEqualsHost) {
  uint32_t seed = 30;
  const struct {
    int n, m;
    int64_t rows, cols;
  } cases[] = {{2, 4, 7, 64}, {1, 2, 3, 10}, {4, 8, 5, 48}, {3, 40, 3, 120}, {7, 8, 2, 8}};
  for (const auto& c : cases) {
    expect_same_mask(Tensor({c.rows, c.cols}, uniform_values(c.rows * c.cols, seed++)),
                     MaskSpec::nm(c.n, c.m));
    expect_same_mask(Tensor({c.rows, c.cols}, tied_values(c.rows * c.cols, seed++, 2)),
                     MaskSpec::nm(c.n, c.m));
  }
}

TEST_F(KernelTest, LayerSelectionEqualsHost) {
  uint32_t seed = 40;
  // The largest spans several blocks of the histogram kernel.
  const Shape shapes[] = {{1, 1}, {7, 9}, {33, 65}, {20, 300}};
  for (const auto& shape : shapes)
    for (double rho : {0.0, 0.2, 0.5, 0.9})
      for (bool compat : {false, true}) {
        expect_same_mask(Tensor({shape.rows, shape.cols}, uniform_values(shape.rows * shape.cols, seed++)),
                         MaskSpec::layer(rho, compat));
        expect_same_mask(Tensor({shape.rows, shape.cols}, tied_values(shape.rows * shape.cols, seed++, 5)),
                         MaskSpec::layer(rho, compat));
      }
}

// Two parties that add their vectors element-wise, in lockstep (an all-reduce of two ranks).
class TwoPartySum {
 public:
  void sum(std::span<int64_t> values) {
    std::unique_lock lock(mutex_);
    const uint64_t generation = generation_;
    if (!waiting_) {
      pending_.assign(values.begin(), values.end());
      waiting_ = true;
      done_.wait(lock, [&] { return generation_ != generation; });
    } else {
      for (size_t i = 0; i < values.size(); ++i) pending_[i] += values[i];
      result_ = pending_;
      waiting_ = false;
      ++generation_;
      done_.notify_all();
    }
    std::copy(result_.begin(), result_.end(), values.begin());
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<int64_t> pending_, result_;
  bool waiting_ = false;
  uint64_t generation_ = 0;
};

TEST_F(KernelTest, LayerSelectionOfRowPartsEqualsTheWholeMatrix) {
  // Rows [0, split) are selected on the device, rows [split, rows) on the host, with their histograms
  // and tie counts summed: together they must give the whole matrix's mask (ties cut in flat order).
  const int64_t rows = 40, cols = 50, split = 17;
  const Tensor whole({rows, cols}, tied_values(rows * cols, 50, 7));
  for (bool compat : {false, true}) {
    const MaskSpec spec = MaskSpec::layer(0.45, compat);
    const Mask expected = select_mask(whole, spec, "m");
    TwoPartySum exchange;
    const auto sum = [&](std::span<int64_t> v) { exchange.sum(v); };
    const MatrixPart device_part{0, rows, sum}, host_part{split, rows, sum};
    const Tensor host_rows({rows - split, cols},
                           std::vector<float>(whole.values().begin() + split * cols, whole.values().end()));
    Mask host_mask;
    std::thread host([&] { host_mask = select_mask(host_rows, spec, "m", &host_part); });
    const cuda::DeviceArray<float> device_scores(whole.data(), split * cols);
    const Mask device_part_mask =
        cuda::select_mask_on_device(device_scores.data(), split, cols, spec, "m", &device_part);
    host.join();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const bool pruned = r < split ? device_part_mask.pruned(r, c) : host_mask.pruned(r - split, c);
        ASSERT_EQ(pruned, expected.pruned(r, c)) << "compat " << compat << " row " << r << " column " << c;
      }
  }
}

TEST_F(KernelTest, NanScoreIsTheHostError) {
  std::vector<float> values = uniform_values(4 * 40, 60);
  values[2 * 40 + 17] = std::nanf("");
  values[3 * 40 + 1] = std::nanf("");
  const Tensor scores({4, 40}, values);
  for (const MaskSpec& spec : {MaskSpec::row(0.5), MaskSpec::layer(0.5), MaskSpec::nm(2, 4)}) {
    const std::string host = error_of([&] { (void)select_mask(scores, spec, "blk.q"); });
    EXPECT_THAT(host, HasSubstr("NaN score in matrix blk.q (row 2, column 17)"));
    EXPECT_EQ(error_of([&] { (void)device_mask(scores, spec, "blk.q"); }), host);
  }
  // The compat layer rule keeps NaN last instead (nothing NaN is pruned).
  expect_same_mask(scores, MaskSpec::layer(0.5, true));
  expect_same_mask(scores, MaskSpec::layer(0.99, true));
}

}  // namespace
}  // namespace symprune::kernel_test
