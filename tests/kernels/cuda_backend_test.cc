// The CUDA backend running whole models: DecoderModel on cuda_backend() against the CPU backend, on the
// synthetic tiny LLaMA (GQA, RoPE, RMSNorm, SiLU) and tiny OPT (LayerNorm, ReLU, learned positions).
// Logits agree within 1e-4 of their largest magnitude (fp32 sums in other orders over 4 blocks); observers
// see host copies; host weight overrides and micro-batching work on device tensors.
#include "core/cuda/kernels/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "io/model_resolver.h"
#include "kernel_test_support.h"
#include "model/decoder_model.h"

namespace symprune::kernel_test {
namespace {

std::vector<int32_t> test_tokens(int64_t count, int64_t vocab) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < count; ++i) tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return tokens;
}

// max |a − e| / max |e|.
double relative_error(const Tensor& actual, const Tensor& expected) {
  EXPECT_EQ(actual.shape(), expected.shape());
  double error = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    error = std::max(error, std::fabs(static_cast<double>(actual[i]) - expected[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(expected[i])));
  }
  return error / scale;
}

// Sums every observed linear's input and output (host tensors) per linear.
class SumObserver final : public model::LinearObserver {
 public:
  void on_linear(const model::LinearId& id, const Tensor& input, const Tensor& output,
                 const Tensor*) override {
    EXPECT_FALSE(input.on_device());
    EXPECT_FALSE(output.on_device());
    double sum = 0.0;
    for (float v : input.values()) sum += v;
    for (float v : output.values()) sum += v;
    sums[id.to_string()] += sum;
  }
  std::map<std::string, double> sums;
};

class CudaBackendModelTest : public KernelTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(CudaBackendModelTest, ForwardMatchesTheCpu) {
  const io::ResolvedModel resolved = io::resolve_model(GetParam());
  model::DecoderModel cpu = model::DecoderModel::open(resolved, cpu_backend());
  model::DecoderModel gpu = model::DecoderModel::open(resolved, cuda::cuda_backend());
  const int64_t n_seqs = 2, seq_len = 12;
  const std::vector<int32_t> tokens = test_tokens(n_seqs * seq_len, cpu.vocab_size());
  const Tensor expected = cpu.forward(tokens, n_seqs, seq_len);
  const Tensor device_logits = gpu.forward(tokens, n_seqs, seq_len);
  ASSERT_TRUE(device_logits.on_device());
  const Tensor actual = cuda::cuda_backend().to_host(device_logits);
  EXPECT_LE(relative_error(actual, expected), 1e-4) << GetParam();

  // One sequence per pass (the micro-batch copies) gives the same logits.
  gpu.set_max_tokens_per_pass(seq_len);
  const Tensor batched = cuda::cuda_backend().to_host(gpu.forward(tokens, n_seqs, seq_len));
  EXPECT_LE(relative_error(batched, actual), 1e-6) << GetParam();
}

// In bf16 and fp16 (linear weights, the tied head's copy and the hidden states in 16 bits; products
// accumulated in fp32): logits within relative error 2e-2 (bf16) and 2e-3 (fp16) of the fp32 CPU's. In
// the emulation one dtype per model (bf16 for the LLaMA, fp16 for the OPT; about 5 s each).
TEST_P(CudaBackendModelTest, ForwardInLowerPrecisionIsNearTheCpu) {
  const io::ResolvedModel resolved = io::resolve_model(GetParam());
  model::DecoderModel cpu = model::DecoderModel::open(resolved, cpu_backend());
  const int64_t n_seqs = 2, seq_len = 12;
  const std::vector<int32_t> tokens = test_tokens(n_seqs * seq_len, cpu.vocab_size());
  const Tensor expected = cpu.forward(tokens, n_seqs, seq_len);
  EXPECT_EQ(cpu.stored_weight_dtype(), DType::kBF16);  // synthetic models are stored in bf16
  struct Bound {
    DType dtype;
    double error;
  };
  std::vector<Bound> bounds = {Bound{DType::kBF16, 2e-2}, Bound{DType::kF16, 2e-3}};
  if (emulated_device()) bounds = {bounds[std::string(GetParam()).find("opt") == std::string::npos ? 0 : 1]};
  for (const Bound& b : bounds) {
    SCOPED_TRACE(dtype_name(b.dtype));
    model::DecoderModel gpu = model::DecoderModel::open(resolved, cuda::cuda_backend());
    gpu.set_storage_dtype(b.dtype);
    EXPECT_EQ(gpu.block_weights(0).linears.at(gpu.linear_names().front()).weight.dtype(), b.dtype);
    const Tensor actual = cuda::cuda_backend().to_host(gpu.forward(tokens, n_seqs, seq_len));
    const double error = relative_error(actual, expected);
    RecordProperty("relative_error_" + std::string(dtype_name(b.dtype)), std::to_string(error));
    EXPECT_LE(error, b.error) << GetParam();
    EXPECT_GT(error, 1e-6) << GetParam();  // it did round
  }
  // The CPU keeps fp32 only.
  model::DecoderModel fresh = model::DecoderModel::open(resolved, cpu_backend());
  EXPECT_THROW(fresh.set_storage_dtype(DType::kBF16), Error);
}

TEST_P(CudaBackendModelTest, ObserversAndOverridesWork) {
  const io::ResolvedModel resolved = io::resolve_model(GetParam());
  model::DecoderModel cpu = model::DecoderModel::open(resolved, cpu_backend());
  model::DecoderModel gpu = model::DecoderModel::open(resolved, cuda::cuda_backend());
  const int64_t n_seqs = 2, seq_len = 8;
  const std::vector<int32_t> tokens = test_tokens(n_seqs * seq_len, cpu.vocab_size());
  // Block 1 with its first linear's weight halved (a host override), observed.
  const std::string first = cpu.linear_names().front();
  const Tensor stored = cpu.block_weights(1).linears.at(first).weight;
  Tensor halved = stored;
  for (float& v : halved.values()) v *= 0.5f;
  model::WeightOverrides overrides;
  overrides.emplace(model::LinearId{1, first}, halved);

  Tensor h_cpu = cpu.embed(tokens, n_seqs, seq_len);
  Tensor h_gpu = gpu.embed(tokens, n_seqs, seq_len);
  SumObserver cpu_seen, gpu_seen;
  for (int64_t b = 0; b < 2; ++b) {
    cpu.run_block(b, h_cpu, n_seqs, seq_len, &cpu_seen, &overrides);
    gpu.run_block(b, h_gpu, n_seqs, seq_len, &gpu_seen, &overrides);
  }
  EXPECT_LE(relative_error(cuda::cuda_backend().to_host(h_gpu), h_cpu), 1e-5);
  ASSERT_EQ(gpu_seen.sums.size(), cpu_seen.sums.size());
  for (const auto& [name, sum] : cpu_seen.sums)
    EXPECT_NEAR(gpu_seen.sums[name], sum, 1e-4 * std::max(1.0, std::fabs(sum))) << name;

  // A changed weight is uploaded and used from then on.
  gpu.set_linear_weight({0, first}, halved);
  cpu.set_linear_weight({0, first}, halved);
  EXPECT_LE(relative_error(cuda::cuda_backend().to_host(gpu.forward(tokens, n_seqs, seq_len)),
                           cpu.forward(tokens, n_seqs, seq_len)),
            1e-4);
}

// In 16 bits the sequences are embedded a micro-batch at a time: H holds the CPU's fp32 embedding rounded
// to bf16, bit for bit, and the most the embedding holds at once is H and about one micro-batch in fp32 (the
// memory plan's terms), not all of H in fp32 beside it (in bytes per token of d values: 48 against 16 + 8).
TEST_P(CudaBackendModelTest, EmbeddingIn16BitsHoldsOneMicroBatchInFp32) {
  const io::ResolvedModel resolved = io::resolve_model(GetParam());
  model::DecoderModel cpu = model::DecoderModel::open(resolved, cpu_backend());
  model::DecoderModel gpu = model::DecoderModel::open(resolved, cuda::cuda_backend());
  gpu.set_storage_dtype(DType::kBF16);
  const int64_t n_seqs = 8, seq_len = 16, d = cpu.hidden_size();
  gpu.set_max_tokens_per_pass(2 * seq_len);  // 4 micro-batches, 2 sequences each
  const std::vector<int32_t> tokens = test_tokens(n_seqs * seq_len, cpu.vocab_size());
  Backend& device = cuda::cuda_backend();
  device.reset_device_memory_peak();
  const int64_t held_before = device.device_memory()->peak_used;
  const Tensor h = gpu.embed(tokens, n_seqs, seq_len);
  const int64_t peak = device.device_memory()->peak_used - held_before;
  ASSERT_EQ(h.dtype(), DType::kBF16);
  const Tensor expected = cpu.embed(tokens, n_seqs, seq_len);
  const Tensor actual = device.to_host(h);
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_EQ(actual[i], bf16_to_float(float_to_bf16(expected[i]))) << "element " << i;
  // The bytes asked for (the emulation; a pool rounds them up): H in bf16 is 2·N·T·d, a micro-batch in fp32
  // 4·2·T·d; all of H in fp32 beside it would be 6·N·T·d.
  const int64_t unit = seq_len * d;
  if (emulated_device()) EXPECT_LE(peak, 2 * n_seqs * unit + 2 * 4 * 2 * unit) << GetParam();
}

// tiny-qwen2: the LLaMA block with biases on q, k and v; tiny-qwen3: with RMSNorms per head of q and k,
// heads twice hidden / heads wide.
INSTANTIATE_TEST_SUITE_P(SyntheticModels, CudaBackendModelTest,
                         ::testing::Values("synthetic:tiny-llama", "synthetic:tiny-opt",
                                           "synthetic:tiny-qwen2", "synthetic:tiny-qwen3"));

// Observes nothing, but its presence makes the blocks keep the fp32 values of the linears' inputs.
class IdleObserver final : public model::LinearObserver {
 public:
  void on_linear(const model::LinearId&, const Tensor&, const Tensor&, const Tensor*) override { ++calls; }
  bool reads_backend_tensors() const override { return true; }
  int calls = 0;
};

// In bf16 without an observer, a LLaMA block keeps only the rounded values of what 16-bit products alone
// read (norms, SiLU, attention output, q and k after RoPE): the hidden states are bit for bit those of the
// same blocks with an observer, which keep the fp32 values, in micro-batches and with a host override. Heads
// of 8 (tiny-llama) take the GEMM attention, which writes its fp32 output anyway; heads of 16
// (tiny-llama-h16) the flash kernel, which then writes the rounded output alone.
class LlamaBlocksTest : public KernelTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(LlamaBlocksTest, WithoutAnObserverGiveTheSameHiddenStatesIn16Bits) {
  const io::ResolvedModel resolved = io::resolve_model(GetParam());
  model::DecoderModel gpu = model::DecoderModel::open(resolved, cuda::cuda_backend());
  gpu.set_storage_dtype(DType::kBF16);
  const int64_t n_seqs = 3, seq_len = 8;
  gpu.set_max_tokens_per_pass(2 * seq_len);  // two micro-batches, the second partial
  const std::vector<int32_t> tokens = test_tokens(n_seqs * seq_len, gpu.vocab_size());
  const std::string first = gpu.linear_names().front();
  Tensor halved = cuda::cuda_backend().to_host(gpu.block_weights(1).linears.at(first).weight);
  for (float& v : halved.values()) v *= 0.5f;
  model::WeightOverrides overrides;
  overrides.emplace(model::LinearId{1, first}, halved);

  Tensor observed = gpu.embed(tokens, n_seqs, seq_len), unobserved = gpu.embed(tokens, n_seqs, seq_len);
  IdleObserver observer;
  for (int64_t b = 0; b < 2; ++b) {
    gpu.run_block(b, observed, n_seqs, seq_len, &observer, &overrides);
    gpu.run_block(b, unobserved, n_seqs, seq_len, nullptr, &overrides);
  }
  EXPECT_EQ(observer.calls, 2 * 2 * 7);  // blocks × micro-batches × linears
  const Tensor expected = cuda::cuda_backend().to_host(observed),
               actual = cuda::cuda_backend().to_host(unobserved);
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_EQ(float_to_bits(actual[i]), float_to_bits(expected[i])) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(SyntheticLlamas, LlamaBlocksTest,
                         ::testing::Values("synthetic:tiny-llama", "synthetic:tiny-llama-h16",
                                           "synthetic:tiny-qwen2", "synthetic:tiny-qwen3"));

}  // namespace
}  // namespace symprune::kernel_test
