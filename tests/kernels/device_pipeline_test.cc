// The pruning pipeline on the CUDA backend against the CPU backend (the specification):
//  * the pruning ops of core::Backend (statistics, scores + selection, masked weights, row NLL, copies,
//    Gram matrices) on device tensors give the CPU's results: statistics, masks and masked weights bit for
//    bit, NLL within 1e-12, Gram matrices within fp32 rounding (exact where the sums are exact);
//  * an end-to-end prune of stories260K (a real trained LLaMA, converted from llama2.c) through
//    engine::prune_model on either backend: the same masks, hence byte-identical pruned weights, and the
//    same perplexities within 1e-4 relative (the forward passes differ only by fp32 rounding order); on a
//    GPU, masks that may differ in near ties (at most 1 weight in 10^4), perplexity then within 0.5 %;
//  * the same run on plain allocations (a device without memory pools) as on the pool, byte for byte;
//  * a device run stopped by SIGTERM after block 3 and resumed from its checkpoint gives the same output;
//  * the same prune in bf16 (and fp16 on a GPU): perplexities within 2 % of the fp32 run's, the same
//    pruned counts, masks differing in under 5 % of the weights, and the same stop and resume;
//  * the device memory plan refuses a run that does not fit, naming what to lower; a run's report gives the
//    plan and the peak its allocations reached, which follows the allocations and stays under the plan.
// Built into the emulated tests (label unit) and into symprune_gpu_tests (label gpu, a real device).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/cuda/kernels/device_mask_selector.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "engine/checkpoint.h"
#include "engine/prune_pipeline.h"
#include "io/convert_llama2c.h"
#include "kernel_test_support.h"
#include "model/decoder_model.h"

namespace symprune::kernel_test {
namespace {
namespace fs = std::filesystem;

Backend& device() {
  return cuda::cuda_backend();
}

Tensor host_tensor(std::vector<int64_t> shape, uint32_t seed) {
  const int64_t count = shape_numel(shape);
  return Tensor(std::move(shape), uniform_values(count, seed));
}

void expect_same_stats(const ActivationStats& a, const ActivationStats& e) {
  EXPECT_EQ(a.in_sumsq, e.in_sumsq);
  EXPECT_EQ(a.in_sum, e.in_sum);
  EXPECT_EQ(a.in_seqsq, e.in_seqsq);
  EXPECT_EQ(a.out_sumsq, e.out_sumsq);
  EXPECT_EQ(a.n_seqs, e.n_seqs);
  EXPECT_EQ(a.seq_len, e.seq_len);
}

// The 4-byte words (fp32 weights) in which two files of equal size differ.
int64_t differing_words(const std::string& a, const std::string& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t differing = 0;
  for (size_t i = 0; i + 4 <= std::min(a.size(), b.size()); i += 4)
    differing += a.compare(i, 4, b, i, 4) != 0;
  return differing;
}

void expect_same_values(const Tensor& a, const Tensor& e) {
  ASSERT_EQ(a.shape(), e.shape());
  for (int64_t i = 0; i < e.numel(); ++i) ASSERT_EQ(a[i], e[i]) << "element " << i;
}

// The allocation mode (pool or plain) as it was when the scope began, restored when it ends.
class AllocationModeRestored {
 public:
  AllocationModeRestored() : was_plain_(cuda::plain_device_allocations()) {}
  ~AllocationModeRestored() { cuda::use_plain_device_allocations(was_plain_); }
  AllocationModeRestored(const AllocationModeRestored&) = delete;
  AllocationModeRestored& operator=(const AllocationModeRestored&) = delete;

 private:
  bool was_plain_;
};

class DevicePruningOpsTest : public KernelTest {};

TEST_F(KernelTest, MemoryPeakFollowsTheAllocationsSinceTheReset) {
  // Sizes in whole 2 MiB (a pool may round a smaller allocation up to that).
  constexpr int64_t kMiB = int64_t{1} << 20;
  const auto peak = [] { return device().device_memory()->peak_used; };
  device().reset_device_memory_peak();
  std::optional<cuda::DeviceArray<float>> first(8 * kMiB / 4);
  const cuda::DeviceArray<float> second(4 * kMiB / 4);
  const int64_t both = peak();
  // Whatever else is held (other tests' scratch, kept by the backend) is held throughout.
  EXPECT_GE(both, 12 * kMiB);
  EXPECT_GE(device().device_memory()->peak_reserved, both);
  first.reset();
  const cuda::DeviceArray<float> third(2 * kMiB / 4);
  EXPECT_EQ(peak(), both);  // 6 MiB held now: the peak stays
  device().reset_device_memory_peak();
  const cuda::DeviceArray<float> fourth(2 * kMiB / 4);
  const int64_t after_reset = peak();  // second, third and fourth: 8 MiB
  EXPECT_LT(after_reset, both);
  EXPECT_GE(after_reset, 8 * kMiB);
  if (emulated_device()) EXPECT_EQ(both - after_reset, 4 * kMiB);  // the emulation counts the bytes asked for
}

// Plain allocations (cudaMalloc/cudaFree, what a device without memory pools gets; the emulation's are all
// plain) on any device: counted to the byte, freed, and memory the ops work in.
TEST_F(KernelTest, PlainAllocationsAreCountedToTheByteAndWork) {
  const AllocationModeRestored restore;
  cuda::use_plain_device_allocations(true);
  ASSERT_TRUE(cuda::plain_device_allocations());
  device().reset_device_memory_peak();
  const cuda::DevicePoolMemory before = cuda::device_pool_memory();
  std::optional<cuda::DeviceArray<float>> first(3000);
  const cuda::DeviceArray<double> second(1000);
  cuda::DevicePoolMemory now = cuda::device_pool_memory();
  EXPECT_EQ(now.used - before.used, 20000);
  EXPECT_EQ(now.reserved, now.used);
  EXPECT_EQ(now.peak_used, now.used);
  first.reset();
  now = cuda::device_pool_memory();
  EXPECT_EQ(now.used - before.used, 8000);
  EXPECT_EQ(now.peak_used - before.used, 20000);
  device().reset_device_memory_peak();
  EXPECT_EQ(cuda::device_pool_memory().peak_used, now.used);

  const Tensor input = host_tensor({3 * 5, 24}, 1), output = host_tensor({3 * 5, 40}, 2);
  const Tensor di = device().to_backend(input), dout = device().to_backend(output);
  expect_same_values(device().to_host(di), input);
  expect_same_stats(device().activation_stats(di, &dout, nullptr, 3, 5),
                    cpu_backend().activation_stats(input, &output, nullptr, 3, 5));
}

TEST_F(DevicePruningOpsTest, StatisticsEqualTheCpuBitForBit) {
  const Tensor input = host_tensor({3 * 5, 24}, 1), output = host_tensor({3 * 5, 40}, 2);
  const Tensor di = device().to_backend(input), dout = device().to_backend(output);
  expect_same_stats(device().activation_stats(di, &dout, nullptr, 3, 5),
                    cpu_backend().activation_stats(input, &output, nullptr, 3, 5));
  expect_same_stats(device().activation_stats(di, nullptr, nullptr, 3, 5),
                    cpu_backend().activation_stats(input, nullptr, nullptr, 3, 5));
  EXPECT_EQ(error_of([&] { device().activation_stats(di, nullptr, nullptr, 4, 5); }),
            error_of([&] { cpu_backend().activation_stats(input, nullptr, nullptr, 4, 5); }));
  // A biased linear (OPT): the output statistic is that of X Wᵀ, the output less its bias, on both.
  const Tensor bias = host_tensor({40}, 6), dbias = device().to_backend(bias);
  const ActivationStats biased = cpu_backend().activation_stats(input, &output, &bias, 3, 5);
  expect_same_stats(device().activation_stats(di, &dout, &dbias, 3, 5), biased);
  Tensor unbiased = output;
  for (int64_t r = 0; r < unbiased.dim(0); ++r)
    for (int64_t c = 0; c < 40; ++c) unbiased[r * 40 + c] = static_cast<float>(output[r * 40 + c] - bias[c]);
  const ActivationStats direct = cpu_backend().activation_stats(input, &unbiased, nullptr, 3, 5);
  for (size_t c = 0; c < 40; ++c)
    EXPECT_NEAR(biased.out_sumsq[c], direct.out_sumsq[c], 1e-6 * direct.out_sumsq[c]) << "channel " << c;
  const Tensor short_bias = host_tensor({39}, 7), dshort = device().to_backend(short_bias);
  EXPECT_EQ(error_of([&] { device().activation_stats(di, &dout, &dshort, 3, 5); }),
            error_of([&] { cpu_backend().activation_stats(input, &output, &short_bias, 3, 5); }));
}

TEST_F(DevicePruningOpsTest, ScoresAndSelectionEqualTheCpu) {
  const int64_t m = 12, n = 32;
  const Tensor w = host_tensor({m, n}, 3);
  const Tensor dw = device().to_backend(w);
  const Tensor input = host_tensor({2 * 4, n}, 4), output = host_tensor({2 * 4, m}, 5);
  const ActivationStats stats = cpu_backend().activation_stats(input, nullptr, nullptr, 2, 4);
  const ActivationStats with_output = cpu_backend().activation_stats(input, &output, nullptr, 2, 4);
  struct Case {
    ScoreMethod method;
    MaskSpec spec;
    const ActivationStats* stats;
    int64_t row_begin, row_end;
  };
  const std::vector<Case> cases = {
      {ScoreMethod::kWanda, MaskSpec::row(0.5), &stats, 0, -1},
      {ScoreMethod::kRIA, MaskSpec::layer(0.4), &stats, 0, -1},
      {ScoreMethod::kRIA, MaskSpec::nm(2, 4), &stats, 3, 9},
      {ScoreMethod::kMagnitude, MaskSpec::layer(0.3), nullptr, 0, -1},
      {ScoreMethod::kStochRIA, MaskSpec::row(0.5), &stats, 0, -1},
      {ScoreMethod::kSymWanda, MaskSpec::row(0.25), &with_output, 0, -1},
  };
  for (const Case& c : cases) {
    ScoreOptions options;
    options.matrix_name = "m";
    options.row_begin = c.row_begin;
    options.row_end = c.row_end;
    const Mask expected = cpu_backend().score_and_select(c.method, w, c.stats, options, c.spec, nullptr);
    const Mask actual = device().score_and_select(c.method, dw, c.stats, options, c.spec, nullptr);
    EXPECT_EQ(std::vector<uint8_t>(actual.flat().begin(), actual.flat().end()),
              std::vector<uint8_t>(expected.flat().begin(), expected.flat().end()))
        << score_method_name(c.method) << " " << describe(c.spec);
  }
}

TEST_F(DevicePruningOpsTest, MaskedWeightsRowNllAndCopiesEqualTheCpu) {
  const Tensor w = host_tensor({7, 13}, 6);
  const Mask mask = cpu_backend().score_and_select(ScoreMethod::kMagnitude, w, nullptr, ScoreOptions{},
                                                   MaskSpec::row(0.5), nullptr);
  const Tensor dw = device().to_backend(w);
  for (MaskedPart part : {MaskedPart::kKept, MaskedPart::kPruned})
    expect_same_values(device().to_host(device().mask_weight(dw, mask, part)),
                       cpu_backend().mask_weight(w, mask, part));
  Tensor applied = w;
  mask.apply(applied);
  expect_same_values(cpu_backend().mask_weight(w, mask, MaskedPart::kKept), applied);

  const Tensor logits = host_tensor({5, 300}, 7);
  const std::vector<int32_t> targets = {0, 299, 17, 150, 3};
  const std::vector<double> expected = cpu_backend().row_nll(logits, targets);
  const std::vector<double> actual = device().row_nll(device().to_backend(logits), targets);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t r = 0; r < expected.size(); ++r) EXPECT_NEAR(actual[r], expected[r], 1e-12 * expected[r]);

  // A duplicate owns its memory: changing it leaves the original.
  Tensor copy = device().duplicate(dw);
  device().relu(copy);
  expect_same_values(device().to_host(dw), w);
  EXPECT_TRUE(device().allocate({3, 4}).on_device());
  ASSERT_TRUE(device().device_memory().has_value());
  EXPECT_GT(device().device_memory()->free, 0);
}

// A mask selected on the device keeps its packed bits there (DeviceMaskBits), and masking a weight reads
// them in place: a mask whose device copy was made to differ from its host bits masks by the device copy;
// once an entry is written on the host that copy is stale, and the host's entries are uploaded instead.
// DSnoT's upload of a mask (upload_mask, here through initial_column_l1) reads the device copy too.
TEST_F(DevicePruningOpsTest, DeviceMasksAreAppliedFromTheirBitsOnTheDevice) {
  const Tensor w = host_tensor({7, 13}, 6);
  const Tensor dw = device().to_backend(w);
  const Mask selected = device().score_and_select(ScoreMethod::kMagnitude, dw, nullptr, ScoreOptions{},
                                                  MaskSpec::row(0.5), nullptr);
  ASSERT_NE(dynamic_cast<const cuda::DeviceMaskBits*>(selected.backend_bits()), nullptr);
  EXPECT_TRUE(selected.packed_only());
  expect_same_values(device().to_host(device().mask_weight(dw, selected, MaskedPart::kKept)),
                     cpu_backend().mask_weight(w, selected, MaskedPart::kKept));

  Mask other(7, 13);
  for (int64_t i = 0; i < other.size(); i += 3) other.flat()[static_cast<size_t>(i)] = 1;
  auto kept = std::make_shared<cuda::DeviceMaskBits>();
  kept->bits = cuda::DeviceArray<uint8_t>(other.pack_bits());
  kept->device = cuda::current_device();
  Mask mixed = Mask::from_bits(7, 13, selected.pack_bits(), kept);
  for (MaskedPart part : {MaskedPart::kKept, MaskedPart::kPruned})
    expect_same_values(device().to_host(device().mask_weight(dw, mixed, part)),
                       cpu_backend().mask_weight(w, other, part));
  EXPECT_EQ(device().initial_column_l1(dw, mixed), cpu_backend().initial_column_l1(w, other));

  Mask written = selected;
  written.set(0, 0, !written.pruned(0, 0));
  mixed.set(0, 0, !mixed.pruned(0, 0));
  EXPECT_EQ(mixed.backend_bits(), nullptr);
  expect_same_values(device().to_host(device().mask_weight(dw, mixed, MaskedPart::kKept)),
                     cpu_backend().mask_weight(w, written, MaskedPart::kKept));
  EXPECT_EQ(device().initial_column_l1(dw, mixed), cpu_backend().initial_column_l1(w, written));
}

// A mask's bits on the device belong to all its copies and are freed with the last one, by whichever thread
// lets it go (on the device that holds them, with that thread's own device unchanged). Plain allocations
// count the bytes exactly and free at once.
TEST_F(DevicePruningOpsTest, AMasksDeviceBitsGoWithItsLastCopyOnAnyThread) {
  const AllocationModeRestored restore;
  cuda::use_plain_device_allocations(true);
  const Tensor dw = device().to_backend(host_tensor({64, 40}, 8));
  const int64_t before = cuda::device_pool_memory().used;
  std::optional<Mask> selected = device().score_and_select(ScoreMethod::kMagnitude, dw, nullptr,
                                                           ScoreOptions{}, MaskSpec::row(0.5), nullptr);
  ASSERT_NE(dynamic_cast<const cuda::DeviceMaskBits*>(selected->backend_bits()), nullptr);
  EXPECT_EQ(cuda::device_pool_memory().used - before, 64 * 40 / 8);
  std::optional<Mask> copy = *selected;
  selected.reset();
  EXPECT_EQ(cuda::device_pool_memory().used - before, 64 * 40 / 8);  // the copy holds them
  const int device_before = cuda::current_device();
  int thread_device_after = -1;
  std::thread([&] {
    copy.reset();
    thread_device_after = cuda::current_device();
  }).join();
  EXPECT_EQ(cuda::device_pool_memory().used, before);
  EXPECT_EQ(thread_device_after, 0);  // a new thread's device, unchanged by the free
  EXPECT_EQ(cuda::current_device(), device_before);
}

// download_bytes goes through a staging buffer of 8 MiB: a download of several buffers and a tail.
TEST_F(DevicePruningOpsTest, StagedDownloadsReturnEveryByte) {
  const size_t count = (size_t{8} << 20) * 2 + 13;
  std::vector<uint8_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const cuda::DeviceArray<uint8_t> on_device(values);
  EXPECT_EQ(cuda::download_bytes(on_device.data(), count), values);
  EXPECT_TRUE(cuda::download_bytes(on_device.data(), 0).empty());
  const std::vector<uint8_t> head = cuda::download_bytes(on_device.data(), 5);
  EXPECT_EQ(head, std::vector<uint8_t>(values.begin(), values.begin() + 5));
}

// The Gram matrix XᵀX of the recon refinement and --refine-guard, computed where X is.
TEST_F(DevicePruningOpsTest, GramMatricesAreTheCpusWithinRounding) {
  struct Case {
    int64_t rows, n;
  };
  // No rows (zeros), one entry, partial tiles of the emulation's 64 × 64 kernel, more columns than rows.
  for (const Case& c : {Case{0, 5}, Case{1, 1}, Case{37, 13}, Case{130, 70}, Case{3, 200}}) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.n);
    // Multiples of 1/4 in [-1, 1]: every product and sum is exact in fp32, so both results are exact.
    const Tensor exact({c.rows, c.n}, tied_values(c.rows * c.n, 8, 9));
    expect_same_values(device().gram(device().to_backend(exact)), cpu_backend().gram(exact));

    // Random values: two fp32 sums of `rows` products differ by at most 2·rows·u·Σ_r |x_ri·x_rj|.
    const Tensor x = host_tensor({c.rows, c.n}, 9);
    const Tensor expected = cpu_backend().gram(x), actual = device().gram(device().to_backend(x));
    ASSERT_EQ(actual.shape(), (std::vector<int64_t>{c.n, c.n}));
    ASSERT_EQ(expected.shape(), actual.shape());
    EXPECT_FALSE(actual.on_device());
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double magnitude = 0.0, exact_sum = 0.0;
        for (int64_t r = 0; r < c.rows; ++r) {
          const double product = static_cast<double>(x[r * c.n + i]) * x[r * c.n + j];
          magnitude += std::abs(product);
          exact_sum += product;
        }
        const double bound = 2.0 * static_cast<double>(c.rows) * 0x1p-24 * magnitude;
        ASSERT_NEAR(actual[i * c.n + j], expected[i * c.n + j], bound) << i << ", " << j;
        ASSERT_NEAR(actual[i * c.n + j], exact_sum, bound) << i << ", " << j;
      }
  }
}

// stories260K as a Hugging Face directory, converted once per test binary.
fs::path stories_dir() {
  static const fs::path dir = [] {
    const char* data = std::getenv("SYMPRUNE_DATA");
    if (data == nullptr) return fs::path();
    const fs::path out =
        fs::temp_directory_path() / ("symprune_device_pipeline_" + std::to_string(::getpid()));
    fs::remove_all(out);
    fs::create_directories(out);
    io::convert_llama2c(fs::path(data) / "stories260K" / "stories260K.bin",
                        fs::path(data) / "stories260K" / "tok512.bin", out / "model", false);
    return out;
  }();
  return dir;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `run` stopped by a SIGTERM after block 3 (the state entering block 4 is saved from host copies of the
// device hidden states), then resumed (restored into device memory) gives `output` bytes and, when it
// evaluates, `uninterrupted`'s perplexities.
void expect_stop_and_resume_give(const engine::PruneConfig& run, const std::string& name,
                                 const engine::PruneResult& uninterrupted, const std::string& output) {
  engine::PruneConfig stopped = run;
  stopped.out = stories_dir() / (name + "_resumed");
  stopped.checkpoint = stories_dir() / (name + "_checkpoint.h5");
  for (const auto& f : {stopped.checkpoint, engine::previous_checkpoint(stopped.checkpoint),
                        engine::checkpoint_marker(stopped.checkpoint)})
    fs::remove(f);
  try {
    engine::prune_model(stopped, [](const engine::BlockProgress& p) {
      if (p.block == 2) interrupt::simulate(SIGTERM);
    });
    ADD_FAILURE() << "the run was not stopped";
  } catch (const interrupt::Interrupted& e) {
    EXPECT_EQ(e.exit_code(), engine::kCheckpointedExitCode) << e.what();
  }
  interrupt::simulate(0);
  stopped.resume = "auto";
  const engine::PruneResult again = engine::prune_model(stopped);
  ASSERT_TRUE(again.resumed_from.has_value());
  EXPECT_EQ(again.resumed_block, 3);
  EXPECT_EQ(file_bytes(stopped.out / "model.safetensors"), output);
  if (run.eval.empty()) return;
  ASSERT_TRUE(again.perplexity && uninterrupted.perplexity);
  EXPECT_EQ(again.perplexity->dense, uninterrupted.perplexity->dense);
  EXPECT_EQ(again.perplexity->pruned, uninterrupted.perplexity->pruned);
}

class DevicePipelineTest : public KernelTest {
 protected:
  void SetUp() override {
    KernelTest::SetUp();
    if (IsSkipped()) return;
    if (stories_dir().empty()) GTEST_SKIP() << "SYMPRUNE_DATA is not set";
  }
  engine::PruneConfig config(const std::string& name, Backend& backend) const {
    engine::PruneConfig c;
    c.model = (stories_dir() / "model").string();
    c.calib = (fs::path(std::getenv("SYMPRUNE_DATA")) / "tinystories" / "tinystories_val.txt").string();
    // In the emulation (every CUDA thread in turn on one core) a few tokens; on a GPU, more windows and
    // tokens.
    const bool small = emulated_device();
    c.nsamples = small ? 3 : 16;
    c.seqlen = small ? 6 : 128;
    c.micro_batch = small ? 2 : 6;  // passes of several windows, the last a partial one
    c.eval = c.calib;
    c.eval_seqlen = small ? 6 : 128;
    c.eval_max_chunks = small ? 1 : 16;
    c.recon_tokens = small ? 6 : 256;
    c.out = stories_dir() / name;
    c.force = true;
    c.backend = &backend;
    return c;
  }
};

// The report's device memory: the peak of the run's allocations at least its calibration states, if it has
// any (every window's hidden states in the storage dtype, stories260K's width 64), and at most the plan,
// with the plan its terms' sum.
void expect_peak_within_the_plan(const engine::PruneResult& result, const engine::PruneConfig& c) {
  const nlohmann::json& memory = result.device_memory;
  ASSERT_TRUE(memory.is_object()) << memory;
  const int64_t peak = memory.at("peak_used").get<int64_t>(), planned = memory.at("planned").get<int64_t>();
  const int64_t element_bytes = c.dtype == "bf16" || c.dtype == "fp16" ? 2 : 4;
  if (memory.at("plan").at("calibration").get<double>() > 0)
    EXPECT_GE(peak, c.nsamples * c.seqlen * 64 * element_bytes) << memory;
  EXPECT_GT(peak, 0) << memory;
  EXPECT_LE(peak, planned) << memory;
  EXPECT_GE(memory.at("peak_reserved").get<int64_t>(), peak) << memory;
  EXPECT_LE(planned, memory.at("available_at_start").get<int64_t>()) << memory;
  EXPECT_EQ(memory.at("allocator"), cuda::plain_device_allocations() ? "cudaMalloc/cudaFree (no memory pools)"
                                                                     : "stream-ordered pool")
      << memory;
  double terms = 0;
  for (const auto& [name, bytes] : memory.at("plan").items()) terms += bytes.get<double>();
  EXPECT_EQ(planned, static_cast<int64_t>(terms)) << memory;
}

TEST_F(DevicePipelineTest, Stories260KPrunesAsOnTheCpu) {
  struct Case {
    const char* name;
    const char* method;
    std::optional<double> sparsity;
    const char* nm;
    const char* group;
    const char* refine;
  };
  std::vector<Case> cases = {Case{"ria_nm_dsnot", "ria", std::nullopt, "2:4", "", "dsnot"},
                             Case{"wanda_row", "wanda", 0.5, "", "row", "none"},
                             Case{"symwanda_layer", "symwanda", 0.6, "", "layer", "none"},
                             Case{"wanda_row_r2dsnot", "wanda", 0.5, "", "row", "r2dsnot"}};
  if (emulated_device()) cases.resize(1);  // about 40 s there (the others about 60 s each)
  for (const Case& k : cases) {
    engine::PruneConfig on_cpu = config(std::string(k.name) + "_cpu", cpu_backend());
    engine::PruneConfig on_device = config(std::string(k.name) + "_device", device());
    for (engine::PruneConfig* c : {&on_cpu, &on_device}) {
      c->method = k.method;
      c->sparsity = k.sparsity;
      c->nm = k.nm;
      c->group = k.group;
      c->refine = k.refine;
      // The emulation refines the attention linears only (the default): DSnoT there costs about 7 ms of
      // barriers per row.
      c->refine_skip = emulated_device() ? "mlp" : "none";
    }
    const engine::PruneResult expected = engine::prune_model(on_cpu);
    const engine::PruneResult actual = engine::prune_model(on_device);
    EXPECT_EQ(actual.config.at("device"), "cuda");
    EXPECT_EQ(expected.config.at("device"), "cpu");
    expect_peak_within_the_plan(actual, on_device);
    EXPECT_TRUE(expected.device_memory.is_null());
    // The same masks, so byte-identical pruned weights, in the emulation (the CPU's fp32 arithmetic). On
    // a GPU the forward passes round differently in the last bits (cuBLAS's summation order, CUDA's expf,
    // FMA contraction), which can flip the entries whose scores tie within that rounding: the same
    // pruned counts, and at most 1 weight in 10^4 differing (stories260K's linears hold 247 040; a flip
    // within a row swaps two). The statistics, scores and selections themselves are bit for bit the CPU's
    // on the same inputs (StatisticsEqualTheCpuBitForBit, ScoresAndSelectionEqualTheCpu).
    const std::string device_bytes = file_bytes(on_device.out / "model.safetensors");
    const int64_t differing = differing_words(device_bytes, file_bytes(on_cpu.out / "model.safetensors"));
    RecordProperty(std::string(k.name) + "_weights_differing_from_the_cpu", std::to_string(differing));
    if (emulated_device())
      EXPECT_EQ(differing, 0) << k.name;
    else
      EXPECT_LE(differing, static_cast<int64_t>(device_bytes.size() / 4 / 10000)) << k.name;
    // Identical masks give the CPU's figures within fp32 rounding; near-tie flips move them a little (the
    // issue's bound for the perplexity: 0.5 %).
    const double figures = differing == 0 ? 1e-4 : 5e-3;
    ASSERT_EQ(actual.layers.size(), expected.layers.size());
    for (size_t i = 0; i < expected.layers.size(); ++i) {
      EXPECT_EQ(actual.layers[i].pruned, expected.layers[i].pruned) << expected.layers[i].name;
      ASSERT_TRUE(actual.layers[i].recon_error && expected.layers[i].recon_error);
      EXPECT_NEAR(*actual.layers[i].recon_error, *expected.layers[i].recon_error,
                  differing == 0 ? 1e-4 : 5e-3 * std::max(1.0, *expected.layers[i].recon_error))
          << expected.layers[i].name;
    }
    ASSERT_TRUE(actual.perplexity && expected.perplexity);
    EXPECT_NEAR(actual.perplexity->dense / expected.perplexity->dense, 1.0, 1e-4) << k.name;
    EXPECT_NEAR(actual.perplexity->pruned / expected.perplexity->pruned, 1.0, figures) << k.name;
    EXPECT_GT(expected.perplexity->pruned, expected.perplexity->dense) << k.name;

    // Stopped by a SIGTERM after block 3 (the state entering block 4 is saved from host copies of the
    // device hidden states), then resumed on the device (restored into device memory): the same output.
    expect_stop_and_resume_give(on_device, k.name, actual, device_bytes);
  }
}

// The same run on plain allocations (cudaMalloc/cudaFree: a device without memory pools) as on the pool:
// the same output, byte for byte, and a peak within the plan. On a GPU only (the emulation's allocations
// are all plain: every other test of it runs them); on a GPU without pools both runs are plain.
TEST_F(DevicePipelineTest, Stories260KPrunesOnPlainAllocationsAsOnThePool) {
  if (emulated_device()) GTEST_SKIP() << "the emulation's allocations are plain in every test";
  const AllocationModeRestored restore;
  engine::PruneConfig pooled = config("wanda_row_pooled", device());
  pooled.method = "wanda";
  pooled.sparsity = 0.5;
  pooled.refine = "dsnot";
  engine::PruneConfig plain = pooled;
  plain.out = stories_dir() / "wanda_row_plain";
  cuda::use_plain_device_allocations(false);
  const engine::PruneResult on_pool = engine::prune_model(pooled);
  cuda::use_plain_device_allocations(true);
  const engine::PruneResult on_plain = engine::prune_model(plain);
  EXPECT_EQ(file_bytes(plain.out / "model.safetensors"), file_bytes(pooled.out / "model.safetensors"));
  expect_peak_within_the_plan(on_plain, plain);
  ASSERT_TRUE(on_plain.perplexity && on_pool.perplexity);
  EXPECT_EQ(on_plain.perplexity->pruned, on_pool.perplexity->pruned);
}

// At debug level the pipeline logs each micro-batch of a pass, and on a device it first waits for the
// micro-batch's queued work (Backend::synchronize), so that the line counts finished work: the run's output
// and perplexities are those of a run at info level, where it waits only for a line every 30 s.
TEST_F(DevicePipelineTest, Stories260KPrunesTheSameWhenEachMicroBatchIsLogged) {
  engine::PruneConfig quiet = config("wanda_row_info", device());
  quiet.method = "wanda";
  quiet.sparsity = 0.5;
  engine::PruneConfig logged = quiet;
  logged.out = stories_dir() / "wanda_row_debug";
  const auto level = spdlog::get_level();
  const engine::PruneResult at_info = engine::prune_model(quiet);
  spdlog::set_level(spdlog::level::debug);
  ASSERT_TRUE(log::debug_enabled());
  engine::PruneResult at_debug;
  try {
    at_debug = engine::prune_model(logged);
  } catch (...) {
    spdlog::set_level(level);
    throw;
  }
  spdlog::set_level(level);
  EXPECT_EQ(file_bytes(logged.out / "model.safetensors"), file_bytes(quiet.out / "model.safetensors"));
  ASSERT_TRUE(at_debug.perplexity && at_info.perplexity);
  EXPECT_EQ(at_debug.perplexity->dense, at_info.perplexity->dense);
  EXPECT_EQ(at_debug.perplexity->pruned, at_info.perplexity->pruned);
}

TEST_F(DevicePipelineTest, Stories260KPrunesInLowerPrecisionNearTheFp32Run) {
  std::vector<DType> dtypes = {DType::kBF16, DType::kF16};
  if (emulated_device()) dtypes.resize(1);  // about 75 s there, most of it the evaluation
  engine::PruneConfig on_cpu = config("wanda_fp32_cpu", cpu_backend());
  on_cpu.method = "wanda";
  // N:M selection is cheap in the emulation (per-row selection costs a minute there). 1:4, not 2:4: a
  // 2:4 stories260K (perplexity 77 against 5.5 dense) is so damaged that any rounding of the attention
  // flips near-tie masks that move its perplexity by 5-20 % (bf16 18 %, fp16 9 % in the emulation's two
  // chunks; 4 % over 40 chunks of 128 tokens), while 1:4's masks from bf16 evaluate within 0.16 % of the
  // fp32 run's on those 40 chunks.
  on_cpu.nm = "1:4";
  if (emulated_device()) {
    // Enough predictions for a perplexity that rounding moves by less than 2 %.
    on_cpu.eval_seqlen = 32;
    on_cpu.eval_max_chunks = 2;
  }
  const engine::PruneResult expected = engine::prune_model(on_cpu);
  EXPECT_EQ(expected.config.at("dtype"), "fp32");  // auto on the CPU
  const std::string expected_bytes = file_bytes(on_cpu.out / "model.safetensors");
  for (DType dtype : dtypes) {
    const std::string name = std::string(model::dtype_option_name(dtype));
    SCOPED_TRACE(name);
    engine::PruneConfig on_device = on_cpu;
    on_device.backend = &device();
    on_device.dtype = name;
    on_device.out = stories_dir() / ("wanda_" + name + "_device");
    const engine::PruneResult actual = engine::prune_model(on_device);
    EXPECT_EQ(actual.config.at("dtype"), name);
    expect_peak_within_the_plan(actual, on_device);
    // Rounded weights, states and attention operands: the perplexities within 2 % of fp32's. The
    // emulation's evaluation is two chunks of 32 tokens, where the pruned model's differs by 2.3 % (8.355
    // against 8.548), so its bound there is 5 %.
    ASSERT_TRUE(actual.perplexity && expected.perplexity);
    EXPECT_NEAR(actual.perplexity->dense / expected.perplexity->dense, 1.0, 0.02);
    EXPECT_NEAR(actual.perplexity->pruned / expected.perplexity->pruned, 1.0,
                emulated_device() ? 0.05 : 0.02);
    // The same sparsity per row; masks that differ only where scores nearly tie (a few per cent of the
    // weights), and the output keeps the input's fp32 weights (bytes equal in size, most equal in value).
    const std::string bytes = file_bytes(on_device.out / "model.safetensors");
    ASSERT_EQ(bytes.size(), expected_bytes.size());
    EXPECT_LT(static_cast<double>(differing_words(bytes, expected_bytes)),
              0.05 * static_cast<double>(bytes.size() / 4));
    ASSERT_EQ(actual.layers.size(), expected.layers.size());
    for (size_t i = 0; i < expected.layers.size(); ++i) {
      EXPECT_EQ(actual.layers[i].pruned, expected.layers[i].pruned) << expected.layers[i].name;
      ASSERT_TRUE(actual.layers[i].recon_error && expected.layers[i].recon_error);
      EXPECT_NEAR(*actual.layers[i].recon_error, *expected.layers[i].recon_error, 0.05)
          << expected.layers[i].name;
    }
    // The states saved at a checkpoint and restored in 16 bits: the same output as the run without stop
    // (in the emulation without the evaluation, which costs most of a run there).
    engine::PruneConfig resumable = on_device;
    if (emulated_device()) resumable.eval.clear();
    expect_stop_and_resume_give(resumable, "wanda_" + name, actual, bytes);
  }
}

TEST_F(DevicePipelineTest, PlanCountsNoActivationsWithoutAForwardPass) {
  // Magnitude reads no activations and, without --eval, no pass runs: neither calibration states nor
  // activations are planned (they were: a micro-batch's, 12 GB for 70B).
  engine::PruneConfig c = config("magnitude_device", device());
  c.method = "magnitude";
  c.nm = "2:4";
  c.eval.clear();
  const engine::PruneResult result = engine::prune_model(c);
  const nlohmann::json& plan = result.device_memory.at("plan");
  EXPECT_EQ(plan.at("activations").get<double>(), 0.0) << plan;
  EXPECT_EQ(plan.at("calibration").get<double>(), 0.0) << plan;
  EXPECT_GT(plan.at("block_weights").get<double>(), 0.0) << plan;
  expect_peak_within_the_plan(result, c);
}

TEST_F(DevicePipelineTest, MemoryPlanRefusesARunThatDoesNotFit) {
  engine::PruneConfig c = config("too_big", device());
  c.method = "wanda";
  c.sparsity = 0.5;
  c.seqlen = 512;
  c.micro_batch = 64;
  // Calibration states alone (two copies of nsamples x 512 tokens x 64 values x 4 bytes) beyond the free
  // memory; the check comes before any calibration text is read. In the emulation the free memory is the
  // host's available memory, which other processes move between this reading and the plan's (a run that
  // then fitted by a few KiB would calibrate on 22 GiB of states and be killed): there, twice the free
  // memory. A GPU's free memory holds still: just above it.
  const int64_t per_window = 2 * 512 * 64 * 4;
  const int64_t windows_in_free = device().device_memory()->free / per_window;
  c.nsamples = emulated_device() ? 2 * windows_in_free : windows_in_free + 1;
  const std::string message = error_of([&] { engine::prune_model(c); });
  EXPECT_NE(message.find("of cuda memory"), std::string::npos) << message;
  EXPECT_NE(message.find("--nsamples " + std::to_string(c.nsamples) + " or --seqlen 512"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--micro-batch 64"), std::string::npos) << message;
  EXPECT_EQ(message.find("--refine-guard"), std::string::npos) << message;  // no Gram matrix here
  EXPECT_FALSE(fs::exists(c.out));

  // With --refine recon the Gram matrix is counted too, and the message names the refinements without it.
  c.refine = "recon";
  const std::string recon = error_of([&] { engine::prune_model(c); });
  EXPECT_NE(recon.find("Gram matrix 115.6 KiB"), std::string::npos) << recon;  // 172² fp32 (down_proj)
  EXPECT_NE(recon.find("--refine dsnot or r2dsnot without --refine-guard"), std::string::npos) << recon;
  EXPECT_FALSE(fs::exists(c.out));

  // The reconstruction error's samples are counted, one input group at a time (one position per window
  // here); and a pass is at least one evaluation sequence, longer here than a micro-batch (one window of 8
  // tokens): 64 tokens x (8 x 64 + 2 x 32 + 4 x 172) values x 4 bytes of activations.
  c.refine = "none";
  c.recon_tokens = 16;
  c.micro_batch = 1;
  c.seqlen = 8;
  c.eval_seqlen = 64;
  // In the emulation 1.2 times the free memory in calibration states (the plan refuses, while the samples
  // held on the host, about 0.73 of these states, stay below the host's check); on a GPU just above it.
  const int64_t short_windows_in_free = device().device_memory()->free / (2 * 8 * 64 * 4);
  c.nsamples = emulated_device() ? short_windows_in_free * 6 / 5 : short_windows_in_free + 1;
  const std::string samples = error_of([&] { engine::prune_model(c); });
  EXPECT_NE(samples.find("activations 316.0 KiB"), std::string::npos) << samples;
  EXPECT_NE(samples.find("--recon-tokens 16 or --no-recon-error (reconstruction samples "), std::string::npos)
      << samples;
  EXPECT_FALSE(fs::exists(c.out));

  // Every token's (--recon-tokens 0): all groups' samples are held on the host, (gathered + own) 2 x 8
  // positions x 364 values x 4 bytes per window, 5.7 (emulation: 6.8) times the device's free memory, which
  // is the host's in the emulation (the GPU machine: 128 GiB beside 80 GB). The host check refuses it before
  // the plan.
  c.recon_tokens = 0;
  const std::string host = error_of([&] { engine::prune_model(c); });
  EXPECT_NE(host.find("of host memory (reconstruction samples "), std::string::npos) << host;
  EXPECT_NE(host.find("lower the tokens the reconstruction error reads (--recon-tokens 0 reads every one: "
                      "give 1024, or --no-recon-error;"),
            std::string::npos)
      << host;
  EXPECT_EQ(host.find("cuda memory"), std::string::npos) << host;
  EXPECT_FALSE(fs::exists(c.out));
}

}  // namespace
}  // namespace symprune::kernel_test
