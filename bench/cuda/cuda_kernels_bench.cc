// Times the CUDA kernels of src/core/cuda/kernels on a real device at LLaMA-2-7B shapes, for the targets
// of the CUDA backend issue: mask selection (per row, N:M, per layer) for every matrix of the model
// under 100 ms in total, scores, activation statistics at 128 × 2048 calibration tokens, attention at
// T = 2048 and RMSNorm. Inputs are random (never zeros); each case is warmed up, then timed `--reps`
// times with a synchronize around each run (host clock), and the median is reported.
//
//   cuda_kernels_bench [--reps N] [--json FILE] [--markdown FILE]
// Exits 2 without a CUDA device (the reason is printed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/accel.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/cuda/kernels/device_activation_stats.h"
#include "core/cuda/kernels/device_attention.h"
#include "core/cuda/kernels/device_dsnot.h"
#include "core/cuda/kernels/device_mask_selector.h"
#include "core/cuda/kernels/device_scores.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/cuda/kernels/mask_kernels.h"

namespace {

using namespace symprune;
using cuda::DeviceArray;

struct MatrixShape {
  const char* name;
  int64_t rows, cols;
};
// One LLaMA-2-7B block; the model has 32.
constexpr MatrixShape kBlock[] = {
    {"q_proj", 4096, 4096},     {"k_proj", 4096, 4096},   {"v_proj", 4096, 4096},    {"o_proj", 4096, 4096},
    {"gate_proj", 11008, 4096}, {"up_proj", 11008, 4096}, {"down_proj", 4096, 11008}};
constexpr int kBlocks = 32;

DeviceArray<float> random_device(int64_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> host(static_cast<size_t>(count));
  for (float& v : host) v = dist(rng);
  return DeviceArray<float>(host);
}

double median_ms(int reps, const std::function<void()>& run) {
  run();  // warm-up: module load, first allocations
  cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    run();
    cuda::synchronize();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::string json_path, markdown_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::stoi(argv[++i]));
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--markdown" && i + 1 < argc) {
      markdown_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cuda_kernels_bench [--reps N] [--json FILE] [--markdown FILE]\n");
      return 2;
    }
  }
  if (accel::device_count() == 0) {
    std::fprintf(stderr, "cuda_kernels_bench: no CUDA device: %s\n", accel::unavailable_reason().c_str());
    return 2;
  }
  const accel::DeviceInfo device = accel::devices().front();
  nlohmann::json cases = nlohmann::json::array();
  // The files are rewritten after every case: a run stopped at its time limit, or by an error in a later
  // case, keeps the cases it finished.
  const auto write_files = [&] {
    const nlohmann::json result = {
        {"device", device.name},
        {"compute_capability", std::to_string(device.compute_capability_major) + "." +
                                   std::to_string(device.compute_capability_minor)},
        {"reps", reps},
        {"cases", cases}};
    // Written beside and renamed over, so that a kill during a write keeps the previous complete file.
    const auto write_atomically = [](const std::string& path, const std::string& text) {
      const std::string temporary = path + ".tmp";
      std::ofstream(temporary) << text;
      std::filesystem::rename(temporary, path);
    };
    if (!json_path.empty()) write_atomically(json_path, result.dump(2) + "\n");
    if (!markdown_path.empty()) {
      std::ostringstream md;
      md << "# CUDA kernels on " << device.name << "\n\nMedian of " << reps
         << " runs each (bench/cuda/cuda_kernels_bench.cc).\n\n| case | ms | note |\n|---|---:|---|\n";
      for (const auto& c : cases)
        md << "| " << c["case"].get<std::string>() << " | " << c["milliseconds"].get<double>() << " | "
           << c["note"].get<std::string>() << " |\n";
      write_atomically(markdown_path, md.str());
    }
  };
  const auto record = [&](const std::string& name, double ms, const std::string& note) {
    cases.push_back({{"case", name}, {"milliseconds", ms}, {"note", note}});
    std::printf("%-44s %10.3f ms  %s\n", name.c_str(), ms, note.c_str());
    std::fflush(stdout);
    write_files();
  };

  // Selection: one block's seven matrices, times 32 blocks (the same shapes in every block).
  {
    std::vector<DeviceArray<float>> scores;
    uint32_t seed = 1;
    for (const auto& m : kBlock) scores.push_back(random_device(m.rows * m.cols, seed++, 0.0f, 1.0f));
    for (const auto& [label, spec] : {std::pair<const char*, MaskSpec>{"row 50%", MaskSpec::row(0.5)},
                                      {"2:4", MaskSpec::nm(2, 4)},
                                      {"layer 50%", MaskSpec::layer(0.5)}}) {
      const double block_ms = median_ms(reps, [&] {
        for (size_t i = 0; i < std::size(kBlock); ++i)
          (void)cuda::select_mask_on_device(scores[i].data(), kBlock[i].rows, kBlock[i].cols, spec,
                                            kBlock[i].name);
      });
      record(std::string("select ") + label + ", all 7B matrices", block_ms * kBlocks,
             "one block x 32, includes the packed mask's copy to the host; target < 100 ms");
    }
    // Where the time of the cases above goes: the selection kernels alone (into masks allocated once), the
    // way of the mask to the host (packed on the device, kept there and copied through a page-locked buffer;
    // the host Mask keeps the bits), the host's pass over such a Mask that the pipeline makes (count; the
    // written masks take its bits without a copy), and masking the bf16 weights with it (the bits read on
    // the device) against masking them with the same masks' host bits (uploaded from pageable memory: what a
    // mask without device bits costs, e.g. a mask gathered from several ranks).
    std::vector<DeviceArray<uint8_t>> masks;
    for (const auto& m : kBlock) masks.emplace_back(m.rows * m.cols);
    const double rows_ms = median_ms(reps, [&] {
      for (size_t i = 0; i < std::size(kBlock); ++i)
        cuda::launch_select_rows(scores[i].data(), kBlock[i].rows, kBlock[i].cols, kBlock[i].cols / 2,
                                 masks[i].data(), {});
    });
    record("select row 50%, kernel only", rows_ms * kBlocks, "one block x 32, masks allocated once");
    const double nm_ms = median_ms(reps, [&] {
      for (size_t i = 0; i < std::size(kBlock); ++i)
        cuda::launch_select_nm(scores[i].data(), kBlock[i].rows, kBlock[i].cols, 2, 4, masks[i].data(), {});
    });
    record("select 2:4, kernel only", nm_ms * kBlocks, "one block x 32, masks allocated once");
    std::vector<Mask> host_masks(std::size(kBlock));
    const double download_ms = median_ms(reps, [&] {
      for (size_t i = 0; i < std::size(kBlock); ++i)
        host_masks[i] = cuda::download_mask(masks[i].data(), kBlock[i].rows, kBlock[i].cols);
    });
    record("mask to the host, all 7B matrices", download_ms * kBlocks,
           "one block x 32: packed on the device and copied (the host Mask stays packed)");
    // (count lives in another translation unit and the build has no LTO: nothing is elided.)
    const double host_ms = median_ms(reps, [&] {
      for (const Mask& mask : host_masks) (void)mask.count();
    });
    record("host mask passes, all 7B matrices", host_ms * kBlocks,
           "one block x 32: count per matrix, as the pipeline does");
    Backend& backend = cuda::cuda_backend();
    std::vector<Tensor> block_weights;
    std::vector<Mask> host_only_masks;
    for (size_t i = 0; i < std::size(kBlock); ++i) {
      block_weights.push_back(backend.to_backend(Tensor({kBlock[i].rows, kBlock[i].cols}), DType::kBF16));
      host_only_masks.push_back(Mask::from_bits(kBlock[i].rows, kBlock[i].cols, host_masks[i].pack_bits()));
    }
    for (const auto& [label, list] :
         {std::pair<const char*, const std::vector<Mask>*>{"bits on the device", &host_masks},
          {"host bits uploaded", &host_only_masks}}) {
      const double mask_ms = median_ms(reps, [&] {
        for (size_t i = 0; i < std::size(kBlock); ++i)
          (void)backend.mask_weight(block_weights[i], (*list)[i], MaskedPart::kKept);
      });
      record(std::string("mask bf16 weights, ") + label + ", all 7B matrices", mask_ms * kBlocks,
             "one block x 32: Backend::mask_weight, as the pipeline masks each pruned weight");
    }
  }
  // Scores of one block's matrices, times 32.
  {
    std::vector<DeviceArray<float>> weights, outputs;
    std::vector<ActivationStats> stats;
    uint32_t seed = 100;
    for (const auto& m : kBlock) {
      weights.push_back(random_device(m.rows * m.cols, seed++));
      outputs.emplace_back(m.rows * m.cols);
      ActivationStats s;
      std::mt19937 rng(seed);
      std::uniform_real_distribution<double> dist(0.0, 100.0);
      for (int64_t c = 0; c < m.cols; ++c) s.in_sumsq.push_back(dist(rng));
      s.n_seqs = 128;
      s.seq_len = 2048;
      stats.push_back(std::move(s));
    }
    for (ScoreMethod method : {ScoreMethod::kWanda, ScoreMethod::kRIA}) {
      const double block_ms = median_ms(reps, [&] {
        for (size_t i = 0; i < std::size(kBlock); ++i) {
          ScoreOptions options;
          options.matrix_name = kBlock[i].name;
          cuda::compute_scores_on_device(method, weights[i].data(), kBlock[i].rows, kBlock[i].cols, nullptr,
                                         &stats[i], options, outputs[i].data());
        }
      });
      record(std::string("scores ") + std::string(score_method_name(method)) + ", all 7B matrices",
             block_ms * kBlocks, "one block x 32, fp64 arithmetic for CPU parity");
    }
  }
  // DSnoT and R²-DSnoT of a block's attention matrices (--refine-skip mlp, the default) and of its
  // down_proj (the widest rows), from a 50 % per-row mask; random μ̃ make every row run its 50 cycles.
  // Includes the mask's upload and download (bytes) and the per-column inputs' upload.
  {
    for (const MatrixShape& m : {kBlock[0], kBlock[6]}) {
      std::mt19937 rng(31);
      std::uniform_real_distribution<double> mean(-1.0, 1.0), positive(0.1, 2.0);
      std::vector<double> mu, var, act;
      for (int64_t c = 0; c < m.cols; ++c) {
        mu.push_back(mean(rng));
        var.push_back(positive(rng));
        act.push_back(positive(rng));
      }
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      std::vector<float> host(static_cast<size_t>(m.rows * m.cols));
      for (float& v : host) v = uniform(rng);
      const Tensor weight = cuda::cuda_backend().to_backend(Tensor({m.rows, m.cols}, std::move(host)));
      DeviceArray<float> scores = random_device(m.rows * m.cols, 33, 0.0f, 1.0f);
      const Mask initial = cuda::select_mask_on_device(scores.data(), m.rows, m.cols, MaskSpec::row(0.5));
      for (const bool r2 : {false, true}) {
        DsnotOptions options;
        if (r2) options.r2 = R2Options{};
        const auto refine = [&] {
          Mask mask = initial;
          (void)cuda::refine_dsnot_on_device(weight, mu, var, act, mask, options, std::nullopt, nullptr);
        };
        const double ms = median_ms(std::max(1, reps / 2), refine);
        const bool attention = m.rows == m.cols;
        record(std::string(r2 ? "r2dsnot " : "dsnot ") + m.name + (attention ? " x4 (q, k, v, o)" : ""),
               attention ? 4 * ms : ms,
               std::string("50 cycles per row; x32 per model") + (r2 ? ", column norms on the device" : ""));
      }
    }
  }
  // Statistics of the four input groups of a block (widths 4096, 4096, 4096, 11008) over 128 × 2048
  // tokens, fed as 16 micro-batches of 8 sequences; the same activation buffer each time.
  {
    const int64_t seq_len = 2048, micro = 8, calls = 16;
    DeviceArray<float> activations = random_device(micro * seq_len * 11008, 7, -3.0f, 3.0f);
    const double block_ms = median_ms(std::max(1, reps / 2), [&] {
      for (int64_t width : {4096, 4096, 4096, 11008}) {
        cuda::DeviceActivationStats stats(width, 0);
        for (int64_t call = 0; call < calls; ++call)
          stats.accumulate(activations.data(), nullptr, micro, seq_len);
        (void)stats.download();
      }
    });
    record("statistics, one block (4 input groups)", block_ms,
           "128 x 2048 tokens in 16 micro-batches; x32 per model");
  }
  // Attention of one layer at T = 2048 for 8 sequences, 32 heads of 128.
  {
    const int64_t seqs = 8, seq_len = 2048, heads = 32, hd = 128, width = heads * hd;
    DeviceArray<float> q = random_device(seqs * seq_len * width, 11),
                       k = random_device(seqs * seq_len * width, 12),
                       v = random_device(seqs * seq_len * width, 13);
    DeviceArray<float> out(seqs * seq_len * width);
    const double ms = median_ms(reps, [&] {
      cuda::launch_attention(q.data(), k.data(), v.data(), seqs, seq_len, heads, heads, hd, 0.088f,
                             out.data(), {});
    });
    const double flops = 2.0 * 2.0 * seqs * heads * (seq_len * (seq_len + 1) / 2.0) * hd;  // causal QK and PV
    record("attention fp32, 8 x 2048, 32 heads x 128", ms,
           std::to_string(flops / (ms * 1e-3) / 1e12).substr(0, 6) + " TFLOP/s (fp32 CUDA cores)");
    // The same in bf16 on tensor cores (--dtype bf16), on q, k and v already rounded (the backend's rounded
    // copies): the fused flash kernel with 16 and 32 rows per warp, and the GEMM path (two strided-batched
    // GEMMs per tile of queries and the causal softmax between them, in tiles of 672 queries) that heads of
    // other sizes take.
    cuda::AttentionScratch scratch;
    const int64_t tile = cuda::attention_query_tile(heads, seq_len, kAttentionTileBytes);
    cuda::attention_16bit(q.data(), k.data(), v.data(), seqs, seq_len, heads, heads, hd, 0.088f, DType::kBF16,
                          tile, scratch, out.data());  // rounds q, k, v into the scratch
    const struct {
      cuda::AttentionPath path;
      const char* name;
    } paths[] = {{cuda::AttentionPath::kFlash16, "flash 16 rows per warp"},
                 {cuda::AttentionPath::kFlash32, "flash 32 rows per warp"},
                 {cuda::AttentionPath::kGemm, "GEMM path"}};
    for (const auto& p : paths) {
      const double bf16_ms = median_ms(reps, [&] {
        cuda::attention_16bit_rounded(scratch.q.data(), scratch.k.data(), scratch.v.data(), seqs, seq_len,
                                      heads, heads, hd, 0.088f, DType::kBF16, tile, scratch, out.data(), {},
                                      p.path);
      });
      const bool flash = p.path != cuda::AttentionPath::kGemm;
      record(std::string("attention bf16 ") + p.name + ", 8 x 2048, 32 heads x 128", bf16_ms,
             std::to_string(flops / (bf16_ms * 1e-3) / 1e12).substr(0, 6) +
                 " causal TFLOP/s (tensor cores; " +
                 (flash ? std::string("fused, no scores in memory)")
                        : "tiles of " + std::to_string(tile) + " queries)"));
    }
  }
  // The seven linears of one block for one micro-batch (8 x 2048 tokens), weights in bf16 as with
  // --dtype bf16: cuBLAS on tensor cores with fp32 accumulation, the fp32 output. The inputs are rounded to
  // bf16 once, at the first call (the backend's rounded copies; in a pass their producers write them). A
  // pass over 128 x 2048 tokens is 16 of these.
  {
    Backend& backend = cuda::cuda_backend();
    const int64_t tokens = 8 * 2048;
    std::vector<Tensor> weights, outputs(std::size(kBlock));
    uint32_t seed = 200;
    double weight_count = 0;
    for (const auto& m : kBlock) {
      std::mt19937 rng(seed++);
      std::uniform_real_distribution<float> uniform(-0.02f, 0.02f);
      std::vector<float> host(static_cast<size_t>(m.rows * m.cols));
      for (float& v : host) v = uniform(rng);
      weights.push_back(backend.to_backend(Tensor({m.rows, m.cols}, std::move(host)), DType::kBF16));
      weight_count += static_cast<double>(m.rows * m.cols);
    }
    const Tensor narrow = backend.to_backend(Tensor({tokens, 4096}, std::vector<float>(tokens * 4096, 0.5f)));
    const Tensor wide = backend.to_backend(Tensor({tokens, 11008}, std::vector<float>(tokens * 11008, 0.5f)));
    const double ms = median_ms(reps, [&] {
      for (size_t i = 0; i < std::size(kBlock); ++i)
        backend.linear(kBlock[i].cols == 4096 ? narrow : wide, weights[i], nullptr, outputs[i]);
    });
    const double flops = 2.0 * static_cast<double>(tokens) * weight_count;
    record("linears of a block bf16, 8 x 2048 tokens", ms,
           std::to_string(flops / (ms * 1e-3) / 1e12).substr(0, 6) +
               " TFLOP/s (inputs already rounded); x16 per pass");
  }
  // RMSNorm over 16384 rows of 4096.
  {
    const int64_t rows = 16384, d = 4096;
    DeviceArray<float> x = random_device(rows * d, 21), w = random_device(d, 22), y(rows * d);
    const double ms =
        median_ms(reps, [&] { cuda::launch_rms_norm(x.data(), w.data(), rows, d, 1e-5f, y.data(), {}); });
    const double bytes = 2.0 * rows * d * sizeof(float);
    record("rms_norm 16384 x 4096", ms, std::to_string(bytes / (ms * 1e-3) / 1e12).substr(0, 5) + " TB/s");
  }
  // The other elementwise ops of a block's forward for one micro-batch (8 x 2048 tokens of 7B), each with
  // the bytes it must move: where the "rest" of a block's time goes. x16 per pass.
  {
    const int64_t rows = 16384, d = 4096, ff = 11008, heads = 32, half = 64;
    DeviceArray<float> x = random_device(rows * d, 23), y = random_device(rows * d, 24);
    DeviceArray<float> gate = random_device(rows * ff, 25), up = random_device(rows * ff, 26), act(rows * ff);
    DeviceArray<float> cos_table = random_device(2048 * half, 27), sin_table = random_device(2048 * half, 28);
    DeviceArray<uint16_t> rounded(rows * d);
    const auto bandwidth = [](double bytes, double ms) {
      return std::to_string(bytes / (ms * 1e-3) / 1e12).substr(0, 5) + " TB/s; x16 per pass";
    };
    const double h = static_cast<double>(rows * d) * sizeof(float);
    double ms = median_ms(reps, [&] {
      cuda::launch_rope(x.data(), rows, 2048, heads, half, cos_table.data(), sin_table.data(), {});
    });
    record("rope 16384 x 4096 (32 heads x 128)", ms, bandwidth(2 * h, ms));
    ms = median_ms(reps, [&] { cuda::launch_silu_mul(gate.data(), up.data(), rows * ff, act.data(), {}); });
    record("silu_mul 16384 x 11008", ms, bandwidth(3 * h * ff / d, ms));
    ms = median_ms(reps, [&] { cuda::launch_add(x.data(), y.data(), rows * d, {}); });
    record("add 16384 x 4096", ms, bandwidth(3 * h, ms));
    ms = median_ms(reps, [&] {
      cuda::launch_convert(x.data(), DType::kF32, rounded.data(), DType::kBF16, rows * d, {});
    });
    record("convert fp32 to bf16 16384 x 4096", ms, bandwidth(1.5 * h, ms));
  }
  return 0;
}
