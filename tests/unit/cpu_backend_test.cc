// Every CPU backend op against a naive double-precision implementation written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace symprune {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (float& v : t.values()) v = dist(gen);
  return t;
}

// max |a - b| / max(|b|, 1e-30) over the whole tensor.
void expect_close(const Tensor& got, const std::vector<double>& want, double rel_tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double max_ref = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(want[i]));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[static_cast<int64_t>(i)]) - want[i]));
  }
  EXPECT_LE(max_diff, rel_tol * std::max(max_ref, 1e-30))
      << "max diff " << max_diff << " max ref " << max_ref;
}

std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t rows = x.dim(0), n = x.dim(1), m = w.dim(0);
  std::vector<double> y(static_cast<size_t>(rows * m));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < m; ++j) {
      double s = b ? (*b)[j] : 0.0;
      for (int64_t c = 0; c < n; ++c) s += static_cast<double>(x[r * n + c]) * w[j * n + c];
      y[static_cast<size_t>(r * m + j)] = s;
    }
  return y;
}

TEST(CpuBackend, LinearWithoutBias) {
  Backend& be = cpu_backend();
  const Tensor x = random_tensor({37, 65}, 1), w = random_tensor({129, 65}, 2);
  Tensor y;
  be.linear(x, w, nullptr, y);
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{37, 129}));
  expect_close(y, naive_linear(x, w, nullptr), 1e-5);
}

// Results must not depend on the thread count: multi-threaded OpenBLAS sgemm sums in another order than its
// single-threaded small-matrix kernel on some CPUs (found on AMD EPYC: perplexity differed in the 7th digit).
TEST(CpuBackend, LinearIsBitIdenticalForOneAndTwoThreads) {
  Backend& be = cpu_backend();
  const int saved = cpu_threads();
  for (const auto& [rows, m, n] : {std::tuple{8192, 64, 64}, {1000, 172, 64}, {16, 512, 64}, {300, 96, 700}}) {
    const Tensor x = random_tensor({rows, n}, 11), w = random_tensor({m, n}, 12);
    Tensor one, two;
    set_cpu_threads(1);
    be.linear(x, w, nullptr, one);
    set_cpu_threads(2);
    be.linear(x, w, nullptr, two);
    ASSERT_EQ(one.numel(), two.numel());
    EXPECT_EQ(std::memcmp(one.data(), two.data(), static_cast<size_t>(one.numel()) * sizeof(float)), 0)
        << rows << "x" << m << "x" << n;
    expect_close(two, naive_linear(x, w, nullptr), 1e-5);
  }
  set_cpu_threads(saved);
}

// --threads must hold on the threads the run starts too (the next block's reader): OpenMP's count is per
// thread, so a new thread starts with the default (one per CPU) until it is given the run's count.
TEST(CpuBackend, ThreadCountIsHandedToAThreadTheRunStarts) {
  const int saved = cpu_threads();
  const int default_count = std::async(std::launch::async, [] { return cpu_threads(); }).get();
  const int wanted = default_count > 1 ? default_count - 1 : 2;
  set_cpu_threads(wanted);
  const int handed = std::async(std::launch::async, [threads = cpu_threads()] {
                       set_cpu_threads_of_this_thread(threads);
                       return cpu_threads();
                     }).get();
  EXPECT_EQ(handed, wanted);
  set_cpu_threads_of_this_thread(0);  // 0 leaves the count as it is
  EXPECT_EQ(cpu_threads(), wanted);
  set_cpu_threads(saved);
}

TEST(CpuBackend, LinearWithBiasAndRank3Input) {
  Backend& be = cpu_backend();
  Tensor x = random_tensor({2, 5, 7}, 3), w = random_tensor({3, 7}, 4), b = random_tensor({3}, 5);
  Tensor y;
  be.linear(x, w, &b, y);
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 5, 3}));
  Tensor x2 = x;
  x2.reshape({10, 7});
  expect_close(y, naive_linear(x2, w, &b), 1e-5);
  // An empty bias tensor means "no bias".
  Tensor empty_bias, y2;
  be.linear(x, w, &empty_bias, y2);
  expect_close(y2, naive_linear(x2, w, nullptr), 1e-5);
}

TEST(CpuBackend, RmsNorm) {
  Backend& be = cpu_backend();
  const Tensor x = random_tensor({9, 33}, 6, 3.0f), w = random_tensor({33}, 7);
  const float eps = 1e-5f;
  Tensor y;
  be.rms_norm(x, w, eps, y);
  std::vector<double> want(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < 9; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < 33; ++j) ss += static_cast<double>(x[r * 33 + j]) * x[r * 33 + j];
    const double inv = 1.0 / std::sqrt(ss / 33 + eps);
    for (int64_t j = 0; j < 33; ++j) want[static_cast<size_t>(r * 33 + j)] = x[r * 33 + j] * inv * w[j];
  }
  expect_close(y, want, 1e-6);
}

TEST(CpuBackend, LayerNormAffineAndPlain) {
  Backend& be = cpu_backend();
  const Tensor x = random_tensor({6, 20}, 8, 2.0f), w = random_tensor({20}, 9), b = random_tensor({20}, 10);
  const float eps = 1e-5f;
  for (const bool affine : {true, false}) {
    Tensor y;
    be.layer_norm(x, affine ? &w : nullptr, affine ? &b : nullptr, eps, y);
    std::vector<double> want(static_cast<size_t>(x.numel()));
    for (int64_t r = 0; r < 6; ++r) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < 20; ++j) mean += x[r * 20 + j];
      mean /= 20;
      for (int64_t j = 0; j < 20; ++j) var += (x[r * 20 + j] - mean) * (x[r * 20 + j] - mean);
      var /= 20;
      for (int64_t j = 0; j < 20; ++j) {
        double v = (x[r * 20 + j] - mean) / std::sqrt(var + eps);
        if (affine) v = v * w[j] + b[j];
        want[static_cast<size_t>(r * 20 + j)] = v;
      }
    }
    expect_close(y, want, 1e-6);
  }
}

TEST(CpuBackend, RopeInvFreqPlain) {
  const auto inv = rope_inv_freq(16, 10000.0);
  ASSERT_EQ(inv.size(), 8u);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(inv[static_cast<size_t>(i)], std::pow(10000.0, -2.0 * i / 16),
                1e-7 * std::pow(10000.0, -2.0 * i / 16));
}

TEST(CpuBackend, RopeInvFreqLlama3ScalingCoversAllThreeRegimes) {
  const Llama3RopeScaling s{8.0, 1.0, 4.0, 64.0};
  const int64_t hd = 32;
  const auto inv = rope_inv_freq(hd, 500000.0, s);
  ASSERT_EQ(inv.size(), 16u);
  const double low_wavelen = 64.0 / 1.0, high_wavelen = 64.0 / 4.0;
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 16; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / hd);
    const double wavelen = 2 * M_PI / f;
    double want;
    if (wavelen < high_wavelen) {
      want = f;
      ++kept;
    } else if (wavelen > low_wavelen) {
      want = f / 8.0;
      ++divided;
    } else {
      const double smooth = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * f / 8.0 + smooth * f;
      ++smoothed;
    }
    EXPECT_NEAR(inv[static_cast<size_t>(i)], want, 2e-7 * want) << "i=" << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(CpuBackend, RopeRotateHalfPerPosition) {
  Backend& be = cpu_backend();
  const int64_t n_seqs = 2, T = 5, H = 3, hd = 8, half = 4;
  const auto inv = rope_inv_freq(hd, 10000.0);
  const Tensor x0 = random_tensor({n_seqs * T, H * hd}, 11);
  Tensor x = x0;
  be.rope(x, SequenceBatch{n_seqs, T}, H, inv);
  std::vector<double> want(static_cast<size_t>(x0.numel()));
  for (int64_t r = 0; r < n_seqs * T; ++r) {
    const int64_t t = r % T;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(inv[static_cast<size_t>(i)]) * t;
        const int64_t base = r * H * hd + h * hd;
        const double x1 = x0[base + i], x2 = x0[base + i + half];
        want[static_cast<size_t>(base + i)] = x1 * std::cos(a) - x2 * std::sin(a);
        want[static_cast<size_t>(base + i + half)] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  }
  expect_close(x, want, 1e-6);
}

// Naive causal grouped-query attention in double.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_seqs,
                                    int64_t T, int64_t H, int64_t KV, int64_t hd, double scale) {
  std::vector<double> out(static_cast<size_t>(q.numel()));
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += static_cast<double>(q[(s * T + i) * H * hd + h * hd + e]) *
                   k[(s * T + j) * KV * hd + g * hd + e];
          p[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += p[static_cast<size_t>(j)] / sum * v[(s * T + j) * KV * hd + g * hd + e];
          out[static_cast<size_t>((s * T + i) * H * hd + h * hd + e)] = acc;
        }
      }
    }
  return out;
}

TEST(CpuBackend, CausalAttentionGqaSeveralQueryBlocks) {
  Backend& be = cpu_backend();
  // T = 300 spans three 128-row query blocks; 4 query heads share 2 kv heads.
  const int64_t n_seqs = 2, T = 300, H = 4, KV = 2, hd = 8;
  const Tensor q = random_tensor({n_seqs * T, H * hd}, 12, 2.0f);
  const Tensor k = random_tensor({n_seqs * T, KV * hd}, 13, 2.0f);
  const Tensor v = random_tensor({n_seqs * T, KV * hd}, 14);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor out;
  be.attention(q, k, v, SequenceBatch{n_seqs, T}, H, KV, scale, out);
  EXPECT_EQ(out.shape(), q.shape());
  expect_close(out, naive_attention(q, k, v, n_seqs, T, H, KV, hd, scale), 1e-5);
}

TEST(CpuBackend, CausalAttentionMha) {
  Backend& be = cpu_backend();
  const int64_t n_seqs = 3, T = 7, H = 2, hd = 4;
  const Tensor q = random_tensor({n_seqs * T, H * hd}, 15), k = random_tensor({n_seqs * T, H * hd}, 16),
               v = random_tensor({n_seqs * T, H * hd}, 17);
  Tensor out;
  be.attention(q, k, v, SequenceBatch{n_seqs, T}, H, H, 0.5f, out);
  expect_close(out, naive_attention(q, k, v, n_seqs, T, H, H, hd, 0.5), 1e-5);
  // The first position of every sequence sees only itself: output = its own value row.
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t e = 0; e < H * hd; ++e) EXPECT_FLOAT_EQ(out[s * T * H * hd + e], v[s * T * H * hd + e]);
}

TEST(CpuBackend, SiluMulReluAdd) {
  Backend& be = cpu_backend();
  const Tensor g = random_tensor({4, 9}, 18, 4.0f), u = random_tensor({4, 9}, 19);
  Tensor out;
  be.silu_mul(g, u, out);
  std::vector<double> want(36);
  for (int64_t i = 0; i < 36; ++i)
    want[static_cast<size_t>(i)] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
  expect_close(out, want, 1e-6);

  Tensor r = g;
  be.relu(r);
  for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(r[i], g[i] > 0 ? g[i] : 0.0f);

  Tensor a = g;
  be.add(a, u);
  for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(a[i], g[i] + u[i]);
}

TEST(CpuBackend, EmbeddingAndPositionRows) {
  Backend& be = cpu_backend();
  const Tensor table = random_tensor({10, 6}, 20);
  const std::vector<int32_t> ids = {3, 0, 9, 3};
  Tensor out;
  be.embedding(table, ids, out);
  ASSERT_EQ(out.shape(), (std::vector<int64_t>{4, 6}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(out[i * 6 + j], table[ids[static_cast<size_t>(i)] * 6 + j]);

  // Two sequences of 2: rows get table rows offset+0, offset+1, offset+0, offset+1.
  const Tensor positions = random_tensor({6, 6}, 21);
  Tensor x = out;
  be.add_position_rows(x, positions, SequenceBatch{2, 2}, 2);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(x[r * 6 + j], out[r * 6 + j] + positions[(2 + r % 2) * 6 + j]);
}

TEST(CpuBackend, ThreadCountDoesNotChangeResults) {
  Backend& be = cpu_backend();
  const Tensor q = random_tensor({2 * 130, 16}, 22), k = random_tensor({2 * 130, 8}, 23),
               v = random_tensor({2 * 130, 8}, 24);
  const int saved = cpu_threads();
  Tensor a, b;
  set_cpu_threads(1);
  be.attention(q, k, v, SequenceBatch{2, 130}, 4, 2, 0.5f, a);
  set_cpu_threads(std::max(2, saved));
  be.attention(q, k, v, SequenceBatch{2, 130}, 4, 2, 0.5f, b);
  set_cpu_threads(saved);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a[i], b[i]);
}

}  // namespace
}  // namespace symprune
