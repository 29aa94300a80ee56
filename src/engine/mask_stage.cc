#include "engine/mask_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "dist/partition.h"
#include "engine/collective_errors.h"
#include "engine/ordered_reduce.h"

namespace symprune::engine {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// This rank's rows of a weight held by `backend`: the weight itself when they are all of them, else a
// copy of them kept in `copy`.
const Tensor& own_rows(Backend& backend, const Tensor& w, dist::Range rows, Tensor& copy) {
  if (rows.begin == 0 && rows.size() == w.dim(0)) return w;
  copy = backend.allocate({rows.size(), w.dim(1)}, w.dtype());
  backend.copy_rows(w, rows.begin, copy, 0, rows.size());
  return copy;
}

// Every rank's rows' mask, gathered into the whole matrix's mask (each rank's rows packed on their own).
// One rank returns its own (packing and unpacking a 7B model's 6.5 G entries for nothing would cost
// seconds); several return the gathered bits as a packed mask when they line up.
Mask gather_mask(dist::Communicator& comm, Mask own, int64_t total_rows, int64_t* bytes) {
  if (comm.size() == 1) return own;
  const int64_t cols = own.cols();
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()));
  for (int p = 0; p < comm.size(); ++p)
    counts[static_cast<size_t>(p)] = (dist::partition(total_rows, comm.size(), p).size() * cols + 7) / 8;
  std::vector<uint8_t> scratch;
  const std::span<const uint8_t> local = own.packed_bits(scratch);  // a device's mask: its bits, not a copy
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<uint8_t> all(static_cast<size_t>(total));
  comm.all_gather_v(std::as_bytes(local), counts, std::as_writable_bytes(std::span<uint8_t>(all)));
  *bytes += total;
  // Each part but the last a whole number of bytes (LLM widths are multiples of 8): the parts laid end to
  // end are the whole mask's packing, kept packed (Mask::from_bits) as the device's masks are.
  bool byte_aligned = true;
  for (int p = 0; p + 1 < comm.size(); ++p)
    byte_aligned = byte_aligned && dist::partition(total_rows, comm.size(), p).size() * cols % 8 == 0;
  if (byte_aligned) return Mask::from_bits(total_rows, cols, std::move(all));
  Mask whole(total_rows, cols);
  size_t at = 0;
  for (int p = 0; p < comm.size(); ++p) {
    const dist::Range rows = dist::partition(total_rows, comm.size(), p);
    const size_t count = static_cast<size_t>(counts[static_cast<size_t>(p)]);
    const Mask part = Mask::unpack_bits(rows.size(), cols, std::span<const uint8_t>(all).subspan(at, count));
    std::copy(part.flat().begin(), part.flat().end(), whole.flat().begin() + rows.begin * cols);
    at += count;
  }
  return whole;
}

// Σ_t (a_r·x_t)² per row of A over the rows x_t of X (both in the backend's memory), for A = rows
// [row_begin, row_begin + a.rows) of a matrix: fp32 products, fp64 sums on the host. The products are sgemms
// (A Xᵀ) of kEnergyBlockRows rows aligned to the whole matrix's row index, the rows this rank lacks being
// zero, so that each row's products come from a GEMM of one shape, at one position, however the rows are
// split over ranks: BLAS picks its kernels, and so the rounding, by shape (with a few tokens OpenBLAS's
// small-matrix kernels gave other last bits for another row count).
std::vector<double> row_sample_energy(Backend& backend, const Tensor& a, const Tensor& x, int64_t row_begin) {
  const int64_t rows = a.dim(0), n = a.dim(1), k = x.dim(0);
  std::vector<double> out(static_cast<size_t>(rows), 0.0);
  if (rows == 0 || k == 0) return out;
  const int64_t row_end = row_begin + rows;
  Tensor block, product, copy;
  for (int64_t first = row_begin / kEnergyBlockRows * kEnergyBlockRows; first < row_end;
       first += kEnergyBlockRows) {
    const int64_t lo = std::max(first, row_begin), hi = std::min(first + kEnergyBlockRows, row_end);
    if (lo != first || hi != first + kEnergyBlockRows || block.empty())
      block = backend.to_backend(Tensor({kEnergyBlockRows, n}), a.dtype());  // zeros
    backend.copy_rows(a, lo - row_begin, block, lo - first, hi - lo);
    backend.linear(block, x, nullptr, product);
    const Tensor& host = backend.host_view(product, copy);
    for (int64_t r = lo; r < hi; ++r) {
      double sum = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const double v = host[(r - first) * k + t];
        sum += v * v;
      }
      out[static_cast<size_t>(r - row_begin)] = sum;
    }
  }
  return out;
}

// Every rank's per-row values, gathered in row order and added in that order.
double ordered_row_sum(dist::Communicator& comm, const std::vector<double>& local, int64_t total_rows) {
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()));
  for (int p = 0; p < comm.size(); ++p)
    counts[static_cast<size_t>(p)] =
        dist::partition(total_rows, comm.size(), p).size() * static_cast<int64_t>(sizeof(double));
  std::vector<double> all(static_cast<size_t>(total_rows));
  comm.all_gather_v(std::as_bytes(std::span<const double>(local)), counts,
                    std::as_writable_bytes(std::span<double>(all)));
  double sum = 0.0;
  for (double v : all) sum += v;
  return sum;
}

}  // namespace

bool refine_skips(const std::string& skip, const std::string& linear) {
  const bool attention = linear.rfind("self_attn.", 0) == 0;
  return (skip == "mlp" && !attention) || (skip == "attn" && attention);
}

double sample_energy(dist::Communicator& comm, Backend& backend, const Tensor& rows, int64_t total_rows,
                     const Tensor& samples) {
  const int64_t row_begin = dist::partition(total_rows, comm.size(), comm.rank()).begin;
  return std::max(ordered_row_sum(comm, row_sample_energy(backend, rows, samples, row_begin), total_rows),
                  0.0);
}

std::optional<double> reconstruction_error(dist::Communicator& comm, Backend& backend,
                                           const Tensor& weight_rows, const Mask& row_mask,
                                           int64_t total_rows, const Tensor& samples, double dense_energy) {
  // The pruned part W − W̃ directly, not a difference of two products (no cancellation).
  const Tensor delta = backend.mask_weight(weight_rows, row_mask, MaskedPart::kPruned);
  const double diff = sample_energy(comm, backend, delta, total_rows, samples);
  if (dense_energy <= 0.0) return diff <= 0.0 ? std::optional<double>(0.0) : std::nullopt;
  return std::sqrt(diff / dense_energy);
}

LinearMask prune_linear(dist::Communicator& comm, const MaskSettings& settings, int64_t block,
                        const std::string& linear, const Tensor& stored_weight, const ActivationStats* stats,
                        const Gram* gram, const Tensor* samples) {
  // Everything here reads the weight's fp32 values: a weight kept in 16 bits is widened once (a copy for
  // the duration of this call; the pipeline masks the stored one).
  Tensor widened;
  const Tensor& weight = settings.backend->fp32_view(stored_weight, widened);
  const int64_t m = weight.dim(0);
  const dist::Range rows = dist::partition(m, comm.size(), comm.rank());
  ScoreOptions options = settings.score;
  options.block = block;
  options.matrix_name = std::to_string(block) + "." + linear;
  options.row_begin = rows.begin;
  options.row_end = rows.end;
  Backend& backend = *settings.backend;
  const MatrixPart part{rows.begin, m, [&comm](std::span<int64_t> v) { comm.all_reduce_sum(v); },
                        [&comm](const std::string& error) {
                          agree_on_errors(comm, [&] {
                            if (!error.empty()) throw Error(error);
                          });
                        }};
  Mask own = backend.score_and_select(settings.method, weight, settings.scores_need_stats ? stats : nullptr,
                                      options, settings.spec, &part);

  LinearMask out;
  Tensor own_copy;
  const Tensor& own_weight = own_rows(backend, weight, rows, own_copy);
  const bool report = samples != nullptr && settings.report_recon_error;
  const Tensor backend_samples = report ? backend.to_backend(*samples) : Tensor();
  const double dense_energy = report ? sample_energy(comm, backend, own_weight, m, backend_samples) : 0.0;
  const RefineSettings& refine = settings.refine;
  if (refine.enabled() && !refine_skips(refine.skip, linear)) {
    SYMPRUNE_ASSERT(stats != nullptr, "refinement of {} without statistics", options.matrix_name);
    if (report)
      out.recon_error_initial =
          reconstruction_error(comm, backend, own_weight, own, m, backend_samples, dense_energy);
    const auto start = std::chrono::steady_clock::now();
    std::optional<NmPattern> nm;
    if (settings.spec.kind == MaskSpec::kNM) nm = NmPattern{settings.spec.n, settings.spec.m};
    // R²-DSnoT's relative factor reads the column norms of the whole initially pruned matrix.
    std::vector<double> column_l1;
    if (refine.method == "r2dsnot") {
      int64_t unused = 0;
      const Mask whole = gather_mask(comm, own, m, &unused);
      if (!backend.device_resident()) whole.unpack();  // once, before the host's threads read it
      column_l1 = backend.initial_column_l1(weight, whole);
    }
    const RefineStats local =
        refine_linear(backend, refine, own_weight, *stats, gram ? gram->g.data() : nullptr,
                      gram ? gram->n : 0, own, nm, column_l1.empty() ? nullptr : &column_l1);
    // Totals over all rows (report figures): the counts added up; the errors and changes added row by row
    // in row order over every rank's rows, so that they are the single process's sums, whatever the rank
    // count (adding each rank's partial sum would round differently with each split).
    std::vector<double> counts = {static_cast<double>(local.swaps), static_cast<double>(local.rows_reverted)};
    comm.all_reduce_sum(counts);
    const auto own_rows = static_cast<size_t>(rows.size());
    SYMPRUNE_ASSERT(local.row_abs_error_before.size() == own_rows &&
                        local.row_abs_error_after.size() == own_rows &&
                        (!local.recon_sq_change || local.row_recon_sq_change.size() == own_rows),
                    "refinement of {}: per-row figures for {} rows", options.matrix_name, own_rows);
    std::vector<double> per_row(3 * own_rows);
    for (size_t r = 0; r < own_rows; ++r) {
      per_row[3 * r] = local.row_abs_error_before[r];
      per_row[3 * r + 1] = local.row_abs_error_after[r];
      per_row[3 * r + 2] = local.recon_sq_change ? local.row_recon_sq_change[r] : 0.0;
    }
    const std::vector<double> sums = ordered_sum(comm, per_row, 3);
    RefineStats total;
    total.swaps = static_cast<int64_t>(counts[0]);
    total.mean_abs_error_before = m > 0 ? sums[0] / static_cast<double>(m) : 0.0;
    total.mean_abs_error_after = m > 0 ? sums[1] / static_cast<double>(m) : 0.0;
    total.rows_reverted = static_cast<int64_t>(counts[1]);
    if (local.recon_sq_change) total.recon_sq_change = sums[2];
    out.refine = total;
    out.refine_seconds = seconds_since(start);
  }
  if (report)
    out.recon_error = reconstruction_error(comm, backend, own_weight, own, m, backend_samples, dense_energy);
  out.mask = gather_mask(comm, std::move(own), m, &out.mask_bytes);
  out.pruned = out.mask.count();
  return out;
}

}  // namespace symprune::engine
