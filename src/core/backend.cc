// Backend's host implementations of the pruning ops (the specification; see core/backend.h).
#include "core/backend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace symprune {
namespace {

constexpr int64_t kParallelMinElements = 1 << 15;  // smaller work runs on one thread

// -log softmax(row)[target], in double.
double host_row_nll(const float* row, int64_t vocab, int32_t target) {
  float mx = row[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return std::log(sum) + mx - static_cast<double>(row[target]);
}

}  // namespace

Tensor Backend::to_backend(Tensor host, DType dtype) {
  SYMPRUNE_ASSERT(supports_dtype(dtype), "{} backend: tensors of dtype {}", name(), dtype_name(dtype));
  return host;
}

Tensor Backend::allocate(std::vector<int64_t> shape, DType dtype) {
  SYMPRUNE_ASSERT(supports_dtype(dtype), "{} backend: tensors of dtype {}", name(), dtype_name(dtype));
  return Tensor(std::move(shape));
}

const Tensor& Backend::fp32_view(const Tensor& tensor, Tensor& copy) {
  if (tensor.dtype() == DType::kF32) return tensor;
  copy = to_backend(tensor, DType::kF32);
  return copy;
}

Tensor Backend::from_stored(std::vector<int64_t> shape, DType dtype, std::span<const std::byte> bytes) {
  Tensor values(std::move(shape));
  SYMPRUNE_ASSERT(
      is_weight_dtype(dtype) && static_cast<int64_t>(bytes.size()) == values.numel() * dtype_size(dtype),
      "from_stored: {} bytes of {} for {}", bytes.size(), dtype_name(dtype), values.shape_string());
  convert_to_f32(dtype, bytes.data(), values.data(), values.numel());
  return values;
}

Tensor Backend::duplicate(const Tensor& tensor) {
  if (!tensor.on_device()) return tensor;
  Tensor copy = allocate(tensor.shape(), tensor.dtype());
  const int64_t width = tensor.rank() == 0 ? 1 : tensor.dim(-1);
  if (tensor.numel() > 0) copy_rows(tensor, 0, copy, 0, tensor.numel() / width);
  return copy;
}

void Backend::add_rms_norm(Tensor& x, const Tensor& residual, const Tensor& weight, float eps, Tensor& y,
                           DType read_as) {
  add(x, residual);
  rms_norm(x, weight, eps, y, read_as);
}

void Backend::copy_rows_rms_norm(const Tensor& src, int64_t src_row, Tensor& x, const Tensor& weight,
                                 float eps, Tensor& y, DType read_as) {
  const int64_t width = x.rank() == 0 ? 1 : x.dim(-1);
  copy_rows(src, src_row, x, 0, width == 0 ? 0 : x.numel() / width);
  rms_norm(x, weight, eps, y, read_as);
}

const Tensor& Backend::host_view(const Tensor& tensor, Tensor& copy) {
  if (!tensor.on_device()) return tensor;
  copy = to_host(tensor);
  return copy;
}

ActivationStats Backend::activation_stats(const Tensor& input, const Tensor* output,
                                          const Tensor* output_bias, int64_t seqs, int64_t seq_len) {
  static const Tensor kNoOutput;
  ActivationStats stats;
  stats.accumulate(input, output ? *output : kNoOutput, seqs, seq_len, output ? output_bias : nullptr);
  return stats;
}

void score_part_agreed(const MatrixPart* part, const std::function<void()>& score) {
  if (part == nullptr || !part->agree_on_scores) return score();
  std::string error;
  try {
    score();
  } catch (const Error& e) {
    error = e.what();
  }
  part->agree_on_scores(error);
}

Mask Backend::score_and_select(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                               const ScoreOptions& options, const MaskSpec& spec, const MatrixPart* part) {
  Tensor scores;
  score_part_agreed(part, [&] { scores = compute_scores(method, weight, stats, options); });
  return select_mask(scores, spec, options.matrix_name, part);
}

Tensor Backend::gram(const Tensor& x) {
  const int64_t n = x.dim(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Tensor copy;
  const float* data = host_view(x, copy).data();
  // G = XᵀX as one sgemm: linear(x = Xᵀ [n, rows], W = Xᵀ) = Xᵀ X.
  Tensor transposed({n, rows});
  transpose_matrix(data, rows, n, transposed.data());
  const Tensor operand = to_backend(std::move(transposed));
  Tensor product;
  linear(operand, operand, nullptr, product);
  return to_host(product);
}

Tensor Backend::mask_weight(const Tensor& weight, const Mask& mask, MaskedPart keep) {
  SYMPRUNE_ASSERT(weight.rank() == 2 && mask.rows() == weight.dim(0) && mask.cols() == weight.dim(1),
                  "mask {}x{} for weight {}", mask.rows(), mask.cols(), weight.shape_string());
  Tensor out(weight.shape());
  const auto pruned = mask.flat();
  const bool keep_pruned = keep == MaskedPart::kPruned;
  const int64_t count = weight.numel();
#pragma omp parallel for schedule(static) if (count >= kParallelMinElements)
  for (int64_t i = 0; i < count; ++i)
    out[i] = (pruned[static_cast<size_t>(i)] != 0) == keep_pruned ? weight[i] : 0.0f;
  return out;
}

RefineStats Backend::refine_dsnot(const Tensor& weight, const std::vector<double>& mu,
                                  const std::vector<double>& var, const std::vector<double>& act_norm,
                                  Mask& mask, const DsnotOptions& options, std::optional<NmPattern> nm,
                                  const std::vector<double>* column_l1) {
  Tensor copy;
  return symprune::refine_dsnot(host_view(weight, copy), mu, var, act_norm, mask, options, nm, column_l1);
}

std::vector<double> Backend::initial_column_l1(const Tensor& weight, const Mask& mask) {
  Tensor copy;
  return symprune::initial_column_l1(host_view(weight, copy), mask);
}

std::optional<NonFiniteEntry> Backend::first_non_finite(const Tensor& tensor) {
  Tensor copy;
  const Tensor& host = host_view(tensor, copy);  // host tensors are fp32
  const int64_t index = symprune::first_non_finite(host);
  if (index < 0) return std::nullopt;
  return NonFiniteEntry{index, host.data()[index]};
}

std::vector<double> Backend::row_nll(const Tensor& logits, std::span<const int32_t> targets) {
  const int64_t vocab = logits.dim(-1), rows = logits.numel() / std::max<int64_t>(vocab, 1);
  SYMPRUNE_ASSERT(static_cast<int64_t>(targets.size()) == rows, "row_nll: {} targets for logits {}",
                  targets.size(), logits.shape_string());
  std::vector<double> nll(static_cast<size_t>(rows));
  const float* data = logits.data();
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r)
    nll[static_cast<size_t>(r)] = host_row_nll(data + r * vocab, vocab, targets[static_cast<size_t>(r)]);
  return nll;
}

}  // namespace symprune
