// Parity of the CUDA kernels with references computed here in double (DESIGN.md §7.1): the CPU is
// the spec. Only built with SYMPRUNE_WITH_CUDA (it calls src/core/cuda). Device tests skip when no
// device is visible; argument checks and the no-device error run everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/accel.h"
#include "core/cuda/cuda_gemm.h"
#include "core/cuda/cuda_rms_norm.h"
#include "core/error.h"
#include "support/error_text.h"

namespace symprune::cuda {
namespace {

using ::testing::HasSubstr;

std::vector<float> random_values(int64_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> out(static_cast<size_t>(count));
  for (auto& v : out) v = dist(rng);
  return out;
}

using test::error_of;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (accel::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << accel::unavailable_reason();
  }
};

struct LinearShape {
  int64_t tokens, in, out;
};

// Non-multiples of 32 (warp size and typical tile sizes), single rows/columns, and a larger square.
const LinearShape kLinearShapes[] = {{1, 1, 1},     {3, 5, 7},     {33, 31, 65},   {17, 300, 1},
                                     {1, 257, 129}, {129, 96, 40}, {256, 512, 384}};

TEST_F(CudaDeviceTest, LinearMatchesDoubleReference) {
  uint32_t seed = 1;
  for (const auto& shape : kLinearShapes) {
    for (bool with_bias : {false, true}) {
      const auto x = random_values(shape.tokens * shape.in, seed++);
      const auto w = random_values(shape.out * shape.in, seed++);
      const auto b = random_values(shape.out, seed++);
      std::vector<float> y(static_cast<size_t>(shape.tokens * shape.out), NAN);
      cuda_linear(x.data(), w.data(), with_bias ? b.data() : nullptr, y.data(), shape.tokens, shape.in,
                  shape.out);
      for (int64_t t = 0; t < shape.tokens; ++t) {
        for (int64_t o = 0; o < shape.out; ++o) {
          double ref = with_bias ? b[o] : 0.0;
          double magnitude = std::abs(ref);  // Σ|terms|: the scale fp32 rounding is relative to
          for (int64_t i = 0; i < shape.in; ++i) {
            const double term = static_cast<double>(x[t * shape.in + i]) * w[o * shape.in + i];
            ref += term;
            magnitude += std::abs(term);
          }
          const double got = y[t * shape.out + o];
          ASSERT_LE(std::abs(got - ref), 1e-4 * magnitude)
              << "tokens " << shape.tokens << " in " << shape.in << " out " << shape.out << " bias "
              << with_bias << " at [" << t << ", " << o << "]: got " << got << ", want " << ref;
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, LinearIsExactOnSmallIntegers) {
  // Integer inputs with small sums are exact in fp32, so the GPU must reproduce them bit for bit.
  const int64_t tokens = 37, in = 45, out = 19;
  std::vector<float> x(tokens * in), w(out * in), b(out);
  for (int64_t i = 0; i < tokens * in; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  for (int64_t i = 0; i < out * in; ++i) w[i] = static_cast<float>(i % 5) - 2.0f;
  for (int64_t o = 0; o < out; ++o) b[o] = static_cast<float>(o) - 9.0f;
  std::vector<float> y(tokens * out);
  cuda_linear(x.data(), w.data(), b.data(), y.data(), tokens, in, out);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      float ref = b[o];
      for (int64_t i = 0; i < in; ++i) ref += x[t * in + i] * w[o * in + i];
      ASSERT_EQ(y[t * out + o], ref) << "at [" << t << ", " << o << "]";
    }
  }
}

double rms_reference(const std::vector<float>& x, const std::vector<float>& weight, int64_t row, int64_t dim,
                     float eps, int64_t c) {
  double sumsq = 0.0;
  for (int64_t i = 0; i < dim; ++i) sumsq += static_cast<double>(x[row * dim + i]) * x[row * dim + i];
  return weight[c] * (x[row * dim + c] / std::sqrt(sumsq / dim + static_cast<double>(eps)));
}

TEST_F(CudaDeviceTest, RmsNormMatchesDoubleReference) {
  struct Shape {
    int64_t rows, dim;
    float eps;
  };
  // dim below, at and far above the 256-thread block; odd sizes; scaled rows check the eps term.
  const Shape shapes[] = {{1, 1, 1e-5f}, {7, 31, 1e-6f}, {5, 256, 1e-5f}, {3, 1000, 1e-6f}, {9, 4099, 1e-5f}};
  uint32_t seed = 100;
  for (const auto& s : shapes) {
    auto x = random_values(s.rows * s.dim, seed++, -3.0f, 3.0f);
    for (int64_t c = 0; c < s.dim; ++c) x[c] *= 1e-3f;  // a small-norm row where eps matters
    const auto weight = random_values(s.dim, seed++, 0.5f, 1.5f);
    std::vector<float> y(x.size(), NAN);
    cuda_rms_norm(x.data(), weight.data(), y.data(), s.rows, s.dim, s.eps);
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.dim; ++c) {
        const double ref = rms_reference(x, weight, r, s.dim, s.eps, c);
        ASSERT_LE(std::abs(y[r * s.dim + c] - ref), 1e-4 * std::abs(ref) + 1e-30)
            << "rows " << s.rows << " dim " << s.dim << " at [" << r << ", " << c << "]";
      }
    }
    // In place (y aliases x) gives the same result.
    auto in_place = x;
    cuda_rms_norm(in_place.data(), weight.data(), in_place.data(), s.rows, s.dim, s.eps);
    EXPECT_EQ(in_place, y);
  }
}

TEST_F(CudaDeviceTest, RmsNormOfZeroRowIsZero) {
  const int64_t dim = 100;
  std::vector<float> x(dim, 0.0f), weight(dim, 1.0f), y(dim, NAN);
  cuda_rms_norm(x.data(), weight.data(), y.data(), 1, dim, 1e-6f);
  EXPECT_EQ(y, x);
}

// These never reach the device, so they run on machines without one too.
TEST(CudaArguments, LinearRejectsBadShapesAndPointers) {
  float v = 1.0f;
  EXPECT_THAT(error_of([&] { cuda_linear(&v, &v, nullptr, &v, -1, 1, 1); }),
              HasSubstr("cuda_linear: negative shape (tokens -1, in 1, out 1)"));
  EXPECT_THAT(error_of([&] { cuda_linear(nullptr, &v, nullptr, &v, 2, 3, 4); }),
              HasSubstr("cuda_linear: null x, w or y pointer for a non-empty shape (tokens 2, in 3, out 4)"));
  EXPECT_THAT(error_of([&] { cuda_linear(&v, &v, nullptr, nullptr, 2, 3, 4); }),
              HasSubstr("cuda_linear: null x, w or y pointer"));
}

TEST(CudaArguments, LinearWithEmptyReductionIsBias) {
  const std::vector<float> bias = {1.5f, -2.0f, 0.25f};
  std::vector<float> y(6, NAN);
  cuda_linear(nullptr, nullptr, bias.data(), y.data(), 2, 0, 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f}));
  cuda_linear(nullptr, nullptr, nullptr, y.data(), 2, 0, 3);
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  EXPECT_NO_THROW(cuda_linear(nullptr, nullptr, nullptr, nullptr, 0, 5, 3));  // no tokens: nothing to do
}

TEST(CudaArguments, RmsNormRejectsBadShapesEpsAndPointers) {
  float v = 1.0f;
  EXPECT_THAT(error_of([&] { cuda_rms_norm(&v, &v, &v, 1, 0, 1e-5f); }),
              HasSubstr("cuda_rms_norm: invalid shape (rows 1, dim 0): rows must be >= 0 and dim >= 1"));
  EXPECT_THAT(error_of([&] { cuda_rms_norm(&v, &v, &v, -2, 4, 1e-5f); }),
              HasSubstr("cuda_rms_norm: invalid shape (rows -2, dim 4)"));
  EXPECT_THAT(error_of([&] { cuda_rms_norm(&v, &v, &v, 1, 1, -1.0f); }),
              HasSubstr("cuda_rms_norm: eps must be >= 0, got -1.0"));
  EXPECT_THAT(error_of([&] { cuda_rms_norm(&v, &v, &v, 1, 1, NAN); }), HasSubstr("eps must be >= 0"));
  EXPECT_THAT(error_of([&] { cuda_rms_norm(&v, nullptr, &v, 1, 1, 1e-5f); }),
              HasSubstr("cuda_rms_norm: null x, weight or y pointer (rows 1, dim 1)"));
}

// Without a device the kernels fail with the CUDA runtime's explanation, not a crash.
TEST(CudaWithoutDevice, KernelsThrowTheRuntimeError) {
  if (accel::device_count() > 0) GTEST_SKIP() << "a device is present";
  std::vector<float> x(6, 1.0f), w(6, 1.0f), y(4);
  const std::string linear_error =
      error_of([&] { cuda_linear(x.data(), w.data(), nullptr, y.data(), 2, 3, 2); });
  EXPECT_THAT(linear_error, HasSubstr("CUDA error at "));
  EXPECT_THAT(linear_error, HasSubstr("cudaMalloc"));
  EXPECT_THAT(linear_error,
              HasSubstr("cudaError"));  // the runtime's error name, e.g. cudaErrorInsufficientDriver
  const std::string norm_error = error_of([&] { cuda_rms_norm(x.data(), w.data(), y.data(), 2, 2, 1e-5f); });
  EXPECT_THAT(norm_error, HasSubstr("CUDA error at "));
  EXPECT_THAT(norm_error, HasSubstr("cudaMalloc"));
}

}  // namespace
}  // namespace symprune::cuda
