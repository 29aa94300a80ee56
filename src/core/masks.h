#pragma once
// Mask selection (DESIGN.md §3.3; compat rules: reference-implementations.md §4).
//
// Scores are [rows, cols] = [out_features, in_features] (the HF weight layout); smaller score = pruned
// first. Order everywhere is ascending by (score, index): among equal scores the lower column index
// (row and N:M modes) or the lower flat index (layer mode) is pruned first. Scores compare as floats, so
// -0.0 and +0.0 are equal. Selection is by k-select (nth_element per row, radix select over the whole
// matrix), never a full sort, and the result does not depend on the number of threads.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace symprune {

// A prune mask over a [rows, cols] matrix; pruned(i) = 1 for the flat row-major index i that is pruned.
//
// A mask made by from_bits (a device's selection: the "only packed masks come back to the host")
// stays bit-packed until an entry is read or written one by one: count, row_count, pack_bits and == read
// the bits, so a 7B model's 6.5 G entries are never spread over a byte each on their way from the device
// selection to the masked weight and the written mask. Reading entries unpacks once (thread-safe: const
// readers may do it concurrently); writing entries (the non-const flat/row/set) marks the packed copy
// stale (threads writing their own rows may do that concurrently, beside threads reading other rows).
// Code about to read a packed mask's entries from many threads unpacks it first (unpack() on one thread),
// or the first reader unpacks it alone while the others wait.
//
// A device's mask also keeps the device's copy of its packed bits (BackendBits), so that masking the weight
// there reads them in place instead of uploading the host's copy again.
class BackendBits {
 public:
  virtual ~BackendBits() = default;
};

class Mask {
 public:
  Mask() = default;
  Mask(int64_t rows, int64_t cols);  // nothing pruned
  Mask(const Mask& other);
  Mask(Mask&& other) noexcept;
  Mask& operator=(const Mask& other);
  Mask& operator=(Mask&& other) noexcept;
  ~Mask() = default;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  bool pruned(int64_t r, int64_t c) const { return entries()[static_cast<size_t>(r * cols_ + c)] != 0; }
  void set(int64_t r, int64_t c, bool value) {
    writable()[static_cast<size_t>(r * cols_ + c)] = value ? 1 : 0;
  }
  std::span<const uint8_t> flat() const { return entries(); }
  std::span<uint8_t> flat() { return writable(); }
  std::span<const uint8_t> row(int64_t r) const;
  std::span<uint8_t> row(int64_t r);

  int64_t count() const;               // pruned entries in the whole matrix
  int64_t row_count(int64_t r) const;  // pruned entries in row r
  double sparsity() const;             // count() / size(); 0 for an empty mask

  // Sets every pruned entry of W to exactly +0.0f and leaves the others bit-identical. W must be
  // [rows, cols] (Error naming both shapes otherwise).
  void apply(Tensor& weight) const;

  // Bit-packed form for exchanges between ranks: flat row-major index i is bit (i % 8) of byte i / 8
  // (LSB first), ceil(rows*cols/8) bytes, unused high bits of the last byte zero.
  std::vector<uint8_t> pack_bits() const;
  // Inverse of pack_bits; Error when the byte count does not match or padding bits are set.
  static Mask unpack_bits(int64_t rows, int64_t cols, std::span<const uint8_t> bits);
  // The same mask kept packed (see above); the same checks. `backend_copy`: the same bits in a backend's
  // memory, shared by copies of the mask. Once entries are written it is no longer offered (backend_bits()
  // is null: it would be stale); its memory is freed with the mask or at its next assignment (threads
  // writing rows at once must not race on it).
  static Mask from_bits(int64_t rows, int64_t cols, std::vector<uint8_t> bits,
                        std::shared_ptr<const BackendBits> backend_copy = nullptr);
  // The packed bits: the mask's own when it holds them (no copy), else pack_bits() kept in `scratch`.
  std::span<const uint8_t> packed_bits(std::vector<uint8_t>& scratch) const;
  // pack_bits() of a mask about to be dropped: its own packed bits moved out when it holds them. The mask
  // is left empty ([0, 0]).
  std::vector<uint8_t> release_bits() &&;
  // The backend's copy of the packed bits (from_bits), null when there is none or entries were written since.
  const BackendBits* backend_bits() const {
    return has_bits_.load(std::memory_order_acquire) ? backend_bits_.get() : nullptr;
  }
  // Unpacks a packed mask's entries now (nothing for a byte mask): before many threads read them.
  void unpack() const { (void)entries(); }
  // Whether the entries are held bit-packed only (not yet unpacked).
  bool packed_only() const {
    return has_bits_.load(std::memory_order_acquire) && !has_bytes_.load(std::memory_order_acquire);
  }

  bool operator==(const Mask& other) const;

 private:
  std::span<const uint8_t> entries() const;  // one byte per entry, unpacked first when needed
  std::span<uint8_t> writable();             // the same, the packed copy dropped

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  // One byte per entry when has_bytes_; filled from bits_ by the first reader of a packed mask.
  mutable std::vector<uint8_t> pruned_;
  mutable std::atomic<bool> has_bytes_{true};
  // pack_bits' layout, valid while has_bits_. Both flags are atomic so that the first access of many
  // threads at once (an OpenMP loop over rows) unpacks once, under a lock, or marks the bits stale.
  std::vector<uint8_t> bits_;
  std::atomic<bool> has_bits_{false};
  std::shared_ptr<const BackendBits> backend_bits_;  // valid while has_bits_, like bits_
};

struct NmPattern {
  int n = 0;
  int m = 0;
};

// Parses "N:M" (e.g. "2:4"): two positive decimal integers, N < M. Error text quotes the input.
NmPattern parse_nm(std::string_view text);

struct MaskSpec {
  enum Kind { kUnstructuredRow, kUnstructuredLayer, kNM };
  Kind kind = kUnstructuredRow;
  double sparsity = 0.0;  // ρ for the unstructured kinds; ignored by kNM
  int n = 0;              // N:M pattern (kNM only)
  int m = 0;
  // Layer mode only: the reference repos' rule θ = sorted[k], prune every score ≤ θ (so at least k+1
  // entries, plus all ties with θ; NaN sorts last and is never pruned). Row and N:M have no threshold
  // form in the references and ignore this flag.
  bool compat_threshold_le = false;

  static MaskSpec row(double rho) { return {kUnstructuredRow, rho, 0, 0, false}; }
  static MaskSpec layer(double rho, bool compat_le = false) {
    return {kUnstructuredLayer, rho, 0, 0, compat_le};
  }
  static MaskSpec nm(int n, int m) { return {kNM, 0.0, n, m, false}; }
  static MaskSpec nm(NmPattern p) { return nm(p.n, p.m); }
};

// "row 50%", "layer 50% (compat <= threshold)", "2:4".
std::string describe(const MaskSpec& spec);

// Number pruned out of `total` at sparsity rho: (int64)(double(total) * rho), truncated like the
// reference repos (4096 at 0.6 -> 2457; 11008 at 0.7 -> 7705).
int64_t prune_count(int64_t total, double rho);

// Errors (naming `matrix_name`) for: sparsity outside [0, 1) or NaN in the unstructured kinds;
// N:M with N < 1, M < 1, N >= M, or M not dividing cols; negative shapes.
void validate_mask_spec(const MaskSpec& spec, int64_t rows, int64_t cols, std::string_view matrix_name);

// A slice of rows of a bigger matrix, held by one of several parts (ranks) that select one mask together.
// Row and N:M masks are row-local and ignore it. Layer masks count over the whole matrix: the parts build
// integer histograms of their rows and `sum_over_parts` adds the vectors of all parts element-wise (an
// all-reduce; every part calls it the same number of times with the same sizes). Integer sums are exact,
// so the mask does not depend on how the rows are split.
struct MatrixPart {
  int64_t row_begin = 0;   // first row of the scores in the whole matrix
  int64_t total_rows = 0;  // rows of the whole matrix
  std::function<void(std::span<int64_t>)> sum_over_parts;
  // Called by Backend::score_and_select once this part's scores are computed, before any selection, with the
  // error they gave ("" when none): throws on every part when any part failed, so that an error of some
  // ranks' rows only (a saturated score) ends every rank alike. Null: an error is thrown as it is.
  std::function<void(const std::string& error)> agree_on_scores;
};

// The mask for a rank-2 score matrix. Validates the spec first. Exact-count modes (row, layer without
// compat, N:M) throw Error "NaN score in matrix <name> ..." if any score is NaN.
//  * row:   exactly prune_count(cols, ρ) per row.
//  * layer: exactly prune_count(rows*cols, ρ) in the matrix, ties by flat index; with
//           compat_threshold_le the "≤ θ" rule instead.
//  * N:M:   exactly N per group of M consecutive columns in each row.
// With `part`, `scores` holds rows [part->row_begin, ...) of a matrix of part->total_rows rows and the result
// is those rows of the whole matrix's mask (ties by flat index of the whole matrix).
Mask select_mask(const Tensor& scores, const MaskSpec& spec, std::string_view matrix_name = "<unnamed>",
                 const MatrixPart* part = nullptr);

// The primitives select_mask needs from wherever the scores are (host memory, a GPU). The selection
// rules (counts, tie order, layer histograms summed over parts, the NaN check) are written once in
// select_mask; a backend supplies these steps over the rows it holds ("local rows"). The mask starts
// with nothing pruned.
class MaskSelector {
 public:
  virtual ~MaskSelector() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  // Flat (local row-major) index of the first NaN score, or -1.
  virtual int64_t first_nan() = 0;
  // Prunes the k smallest (order key, column) of every row.
  virtual void select_rows(int64_t k) = 0;
  // Prunes the n smallest (order key, index in group) of every group of m consecutive columns.
  virtual void select_nm(int n, int m) = 0;
  // hist[b] = how many scores have (key & prefix_mask) == prefix and (key >> shift) & (bins - 1) == b,
  // bins = hist.size() (a power of two); key = score_order_key.
  virtual void key_histogram(uint32_t prefix, uint32_t prefix_mask, int shift, std::span<int64_t> hist) = 0;
  // Prunes exactly the scores whose key is below threshold_key; equal_in_row[r] = how many keys of
  // local row r equal it.
  virtual void prune_below_key(uint32_t threshold_key, std::span<int64_t> equal_in_row) = 0;
  // Also prunes, in each local row r, the first quota[r] scores (by column) whose key equals threshold_key.
  virtual void prune_first_equal(uint32_t threshold_key, std::span<const int64_t> quota) = 0;
  // Prunes exactly the scores <= theta (the compat layer rule; NaN never).
  virtual void prune_at_most(float theta) = 0;
  virtual Mask take_mask() = 0;
};

// select_mask on a backend's scores (`selector` holds the local rows of `part`, or the whole matrix).
Mask select_mask(MaskSelector& selector, const MaskSpec& spec, std::string_view matrix_name = "<unnamed>",
                 const MatrixPart* part = nullptr);

// Monotone unsigned key of a score under the mask order: a < b (as floats) iff key(a) < key(b);
// -0.0 and +0.0 share a key; every NaN maps to 0xFFFFFFFF, above +inf (torch's sort puts NaN last).
// Public so that a distributed radix select can build the same histograms.
uint32_t score_order_key(float score);
float score_from_order_key(uint32_t key);  // inverse on non-NaN keys (gives +0.0 for zero)

}  // namespace symprune
