#include "core/masks.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace symprune {

// Below this many entries a parallel region costs more than it saves (many small test matrices).
constexpr int64_t kParallelMin = int64_t{1} << 15;

// ---------------------------------------------------------------------------------------------------
// Mask

Mask::Mask(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {
  SYMPRUNE_ASSERT(rows >= 0 && cols >= 0, "mask shape [{}, {}]", rows, cols);
  pruned_.assign(static_cast<size_t>(rows * cols), 0);
}

// Copies hold what the source holds (a packed mask stays packed); the source's bytes are read only once
// they are complete (has_bytes_ is set after the unpacking that fills them).
Mask::Mask(const Mask& other) : rows_(other.rows_), cols_(other.cols_) {
  const bool bytes = other.has_bytes_.load(std::memory_order_acquire);
  const bool bits = other.has_bits_.load(std::memory_order_acquire);
  if (bytes) pruned_ = other.pruned_;
  if (bits) {
    bits_ = other.bits_;
    backend_bits_ = other.backend_bits_;
  }
  has_bytes_.store(bytes, std::memory_order_relaxed);
  has_bits_.store(bits, std::memory_order_relaxed);
}

Mask::Mask(Mask&& other) noexcept {
  *this = std::move(other);
}

Mask& Mask::operator=(const Mask& other) {
  if (this != &other) *this = Mask(other);
  return *this;
}

Mask& Mask::operator=(Mask&& other) noexcept {
  if (this == &other) return *this;
  rows_ = std::exchange(other.rows_, 0);
  cols_ = std::exchange(other.cols_, 0);
  pruned_ = std::move(other.pruned_);
  bits_ = std::move(other.bits_);
  backend_bits_ = std::move(other.backend_bits_);
  has_bytes_.store(other.has_bytes_.exchange(true), std::memory_order_relaxed);
  has_bits_.store(other.has_bits_.exchange(false), std::memory_order_relaxed);
  other.pruned_.clear();
  other.bits_.clear();
  return *this;
}

std::span<const uint8_t> Mask::row(int64_t r) const {
  return entries().subspan(static_cast<size_t>(r * cols_), static_cast<size_t>(cols_));
}

std::span<uint8_t> Mask::row(int64_t r) {
  return writable().subspan(static_cast<size_t>(r * cols_), static_cast<size_t>(cols_));
}

namespace {
// Popcount of bits [first, first + count) of a packed mask.
int64_t count_bits(std::span<const uint8_t> bits, int64_t first, int64_t count) {
  int64_t total = 0, i = first;
  const int64_t end = first + count;
  for (; i < end && i % 64 != 0; ++i) total += (bits[static_cast<size_t>(i / 8)] >> (i % 8)) & 1u;
  const int64_t words = (end - i) / 64;
#pragma omp parallel for reduction(+ : total) schedule(static) if (words >= kParallelMin / 64)
  for (int64_t w = 0; w < words; ++w) {
    uint64_t word;
    std::memcpy(&word, bits.data() + (i / 8) + w * 8, sizeof word);
    total += std::popcount(word);
  }
  for (i += words * 64; i < end; ++i) total += (bits[static_cast<size_t>(i / 8)] >> (i % 8)) & 1u;
  return total;
}
}  // namespace

int64_t Mask::count() const {
  if (packed_only()) return count_bits(bits_, 0, size());
  int64_t total = 0;
  const std::span<const uint8_t> entries = flat();
  const uint8_t* p = entries.data();
  const int64_t size = static_cast<int64_t>(entries.size());
#pragma omp parallel for reduction(+ : total) schedule(static) if (size >= kParallelMin)
  for (int64_t i = 0; i < size; ++i) total += p[i];
  return total;
}

int64_t Mask::row_count(int64_t r) const {
  if (packed_only()) return count_bits(bits_, r * cols_, cols_);
  int64_t total = 0;
  for (uint8_t v : row(r)) total += v;
  return total;
}

double Mask::sparsity() const {
  return size() == 0 ? 0.0 : static_cast<double>(count()) / static_cast<double>(size());
}

void Mask::apply(Tensor& weight) const {
  SYMPRUNE_CHECK(weight.rank() == 2 && weight.dim(0) == rows_ && weight.dim(1) == cols_,
                 "mask of shape [{}, {}] cannot be applied to a weight of shape {}", rows_, cols_,
                 weight.shape_string());
  float* w = weight.data();
  const std::span<const uint8_t> entries = flat();
  const uint8_t* p = entries.data();
  const int64_t size = static_cast<int64_t>(entries.size());
#pragma omp parallel for schedule(static) if (size >= kParallelMin)
  for (int64_t i = 0; i < size; ++i)
    if (p[i]) w[i] = 0.0f;
}

bool Mask::operator==(const Mask& other) const {
  if (rows_ != other.rows_ || cols_ != other.cols_) return false;
  const bool bits = has_bits_.load(std::memory_order_acquire);
  const bool other_bits = other.has_bits_.load(std::memory_order_acquire);
  if (bits && other_bits) return bits_ == other.bits_;
  if (bits) return other.pack_bits() == bits_;  // a packed mask against a byte mask: compared packed
  if (other_bits) return pack_bits() == other.bits_;
  const auto a = flat(), b = other.flat();
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

namespace {

// Byte j of a little-endian word is its bits 8j..8j+7 (the words below load and store eight mask bytes).
static_assert(std::endian::native == std::endian::little, "the mask's bit packing assumes little-endian");

// Eight mask bytes (any nonzero byte is pruned) as one packed byte, bit j = byte j: each byte is first
// reduced to 0 or 1 (its bits ORed into bit 0), then one multiplication gathers the eight bits into the top
// byte (byte j's bit lands at bit 56 + j, and no two partial products overlap, so nothing carries).
inline uint8_t pack_eight(const uint8_t* bytes) {
  uint64_t x;
  std::memcpy(&x, bytes, sizeof x);
  x = ((x >> 4) & 0x0F0F0F0F0F0F0F0FULL) | (x & 0x0F0F0F0F0F0F0F0FULL);
  x = ((x >> 2) & 0x0303030303030303ULL) | (x & 0x0303030303030303ULL);
  x = ((x >> 1) & 0x0101010101010101ULL) | (x & 0x0101010101010101ULL);
  return static_cast<uint8_t>((x * 0x0102040810204080ULL) >> 56);
}

// The inverse: the eight mask bytes (0 or 1) of one packed byte, from a table of 256 words.
constexpr std::array<uint64_t, 256> kUnpackedBytes = [] {
  std::array<uint64_t, 256> table{};
  for (unsigned bits = 0; bits < 256; ++bits) {
    uint64_t word = 0;
    for (unsigned j = 0; j < 8; ++j) word |= static_cast<uint64_t>((bits >> j) & 1u) << (8 * j);
    table[bits] = word;
  }
  return table;
}();

}  // namespace

// Eight entries at a time (half the time of a bit loop, most of the rest is the memory: these run on every
// mask the device and the ranks exchange and every checkpoint writes); the tail of size % 8 entries bit by
// bit.
std::vector<uint8_t> Mask::pack_bits() const {
  if (has_bits_.load(std::memory_order_acquire)) return bits_;
  const int64_t size = static_cast<int64_t>(pruned_.size());
  const int64_t full = size / 8, bytes = (size + 7) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(bytes), 0);
  const uint8_t* p = pruned_.data();
#pragma omp parallel for schedule(static) if (size >= kParallelMin)
  for (int64_t b = 0; b < full; ++b) out[static_cast<size_t>(b)] = pack_eight(p + b * 8);
  for (int64_t i = full * 8; i < size; ++i)
    out[static_cast<size_t>(full)] |= static_cast<uint8_t>((p[i] ? 1u : 0u) << (i % 8));
  return out;
}

std::span<const uint8_t> Mask::packed_bits(std::vector<uint8_t>& scratch) const {
  if (has_bits_.load(std::memory_order_acquire)) return bits_;
  scratch = pack_bits();
  return scratch;
}

std::vector<uint8_t> Mask::release_bits() && {
  std::vector<uint8_t> bits = has_bits_.load(std::memory_order_acquire) ? std::move(bits_) : pack_bits();
  *this = Mask();
  return bits;
}

namespace {

void check_packed(int64_t rows, int64_t cols, std::span<const uint8_t> bits) {
  SYMPRUNE_CHECK(rows >= 0 && cols >= 0, "bit-packed mask: invalid shape [{}, {}]", rows, cols);
  const int64_t size = rows * cols;
  const int64_t bytes = (size + 7) / 8;
  SYMPRUNE_CHECK(static_cast<int64_t>(bits.size()) == bytes,
                 "bit-packed mask of shape [{}, {}] needs {} bytes, got {}", rows, cols, bytes, bits.size());
  if (size % 8 != 0 && bytes > 0) {
    const uint8_t padding = static_cast<uint8_t>(0xFFu << (size % 8));
    SYMPRUNE_CHECK((bits[static_cast<size_t>(bytes - 1)] & padding) == 0,
                   "bit-packed mask of shape [{}, {}]: padding bits of the last byte are set", rows, cols);
  }
}

// Fills out[0, size) with the entries of `bits`.
void unpack_into(std::span<const uint8_t> bits, int64_t size, uint8_t* out) {
  const int64_t full = size / 8;
#pragma omp parallel for schedule(static) if (size >= kParallelMin)
  for (int64_t b = 0; b < full; ++b)
    std::memcpy(out + b * 8, &kUnpackedBytes[bits[static_cast<size_t>(b)]], 8);
  for (int64_t i = full * 8; i < size; ++i) out[i] = (bits[static_cast<size_t>(i / 8)] >> (i % 8)) & 1u;
}

std::mutex& unpack_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

Mask Mask::unpack_bits(int64_t rows, int64_t cols, std::span<const uint8_t> bits) {
  check_packed(rows, cols, bits);
  Mask mask(rows, cols);
  unpack_into(bits, rows * cols, mask.pruned_.data());
  return mask;
}

Mask Mask::from_bits(int64_t rows, int64_t cols, std::vector<uint8_t> bits,
                     std::shared_ptr<const BackendBits> backend_copy) {
  check_packed(rows, cols, bits);
  Mask mask;
  mask.rows_ = rows;
  mask.cols_ = cols;
  mask.bits_ = std::move(bits);
  mask.backend_bits_ = std::move(backend_copy);
  mask.has_bits_.store(true, std::memory_order_relaxed);
  mask.has_bytes_.store(false, std::memory_order_relaxed);
  return mask;
}

std::span<const uint8_t> Mask::entries() const {
  if (!has_bytes_.load(std::memory_order_acquire)) {
    const std::lock_guard<std::mutex> lock(unpack_mutex());
    if (!has_bytes_.load(std::memory_order_relaxed)) {
      pruned_.resize(static_cast<size_t>(size()));
      unpack_into(bits_, size(), pruned_.data());
      has_bytes_.store(true, std::memory_order_release);
    }
  }
  return pruned_;
}

// The packed copy is marked stale, not freed: a thread may still be reading it for a row that another
// thread is not writing (row_count of row 5 while row 7 is written). It is freed with the mask, or
// replaced by an assignment.
std::span<uint8_t> Mask::writable() {
  (void)entries();
  if (has_bits_.load(std::memory_order_acquire)) has_bits_.store(false, std::memory_order_release);
  return pruned_;
}

// ---------------------------------------------------------------------------------------------------
// Specs

NmPattern parse_nm(std::string_view text) {
  const auto bad = [&]() {
    fail("invalid N:M pattern '{}': expected two positive integers N:M with N < M, such as 2:4 or 4:8", text);
  };
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) bad();
  const auto parse_int = [&](std::string_view part) {
    int value = 0;
    if (part.empty() || part.front() == '+' || part.front() == '-') bad();
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (ec != std::errc() || ptr != part.data() + part.size()) bad();
    return value;
  };
  NmPattern p{parse_int(text.substr(0, colon)), parse_int(text.substr(colon + 1))};
  SYMPRUNE_CHECK(p.n > 0 && p.m > 0, "invalid N:M pattern '{}': N and M must be positive", text);
  SYMPRUNE_CHECK(p.n < p.m, "invalid N:M pattern '{}': N ({}) must be smaller than M ({})", text, p.n, p.m);
  return p;
}

std::string describe(const MaskSpec& spec) {
  switch (spec.kind) {
    case MaskSpec::kUnstructuredRow:
      return fmt::format("row {:.10g}%", spec.sparsity * 100.0);
    case MaskSpec::kUnstructuredLayer:
      return fmt::format("layer {:.10g}%{}", spec.sparsity * 100.0,
                         spec.compat_threshold_le ? " (compat <= threshold)" : "");
    case MaskSpec::kNM:
      return fmt::format("{}:{}", spec.n, spec.m);
  }
  return "unknown";
}

int64_t prune_count(int64_t total, double rho) {
  return static_cast<int64_t>(static_cast<double>(total) * rho);
}

void validate_mask_spec(const MaskSpec& spec, int64_t rows, int64_t cols, std::string_view matrix_name) {
  SYMPRUNE_CHECK(rows >= 0 && cols >= 0, "matrix {}: invalid shape [{}, {}]", matrix_name, rows, cols);
  switch (spec.kind) {
    case MaskSpec::kUnstructuredRow:
    case MaskSpec::kUnstructuredLayer:
      // Written so that NaN fails too.
      SYMPRUNE_CHECK(spec.sparsity >= 0.0 && spec.sparsity < 1.0, "matrix {}: sparsity {} is outside [0, 1)",
                     matrix_name, spec.sparsity);
      return;
    case MaskSpec::kNM:
      SYMPRUNE_CHECK(spec.n > 0 && spec.m > 0,
                     "matrix {}: invalid N:M pattern {}:{}: N and M must be positive", matrix_name, spec.n,
                     spec.m);
      SYMPRUNE_CHECK(spec.n < spec.m, "matrix {}: invalid N:M pattern {}:{}: N must be smaller than M",
                     matrix_name, spec.n, spec.m);
      SYMPRUNE_CHECK(cols % spec.m == 0,
                     "matrix {}: N:M pattern {}:{} needs the row width to be a multiple of {}, but it is {}",
                     matrix_name, spec.n, spec.m, spec.m, cols);
      return;
  }
  fail("matrix {}: unknown mask kind {}", matrix_name, static_cast<int>(spec.kind));
}

uint32_t score_order_key(float score) {
  if (std::isnan(score)) return 0xFFFFFFFFu;
  if (score == 0.0f) score = 0.0f;  // -0.0 -> +0.0
  const uint32_t bits = std::bit_cast<uint32_t>(score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

float score_from_order_key(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  return std::bit_cast<float>(bits);
}

// ---------------------------------------------------------------------------------------------------
// Selection on host scores

namespace {

// (order key, column) packed so that plain integer order is the mask order with lower-index tie-break.
inline uint64_t row_key(float score, int64_t col) {
  return (static_cast<uint64_t>(score_order_key(score)) << 32) | static_cast<uint64_t>(col);
}

class HostMaskSelector final : public MaskSelector {
 public:
  explicit HostMaskSelector(const Tensor& scores)
      : scores_(scores), rows_(scores.dim(0)), cols_(scores.dim(1)), mask_(rows_, cols_) {}

  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }

  int64_t first_nan() override {
    const float* s = scores_.data();
    const int64_t size = scores_.numel();
    int64_t first = std::numeric_limits<int64_t>::max();
#pragma omp parallel for reduction(min : first) schedule(static) if (size >= kParallelMin)
    for (int64_t i = 0; i < size; ++i)
      if (std::isnan(s[i])) first = std::min(first, i);
    return first == std::numeric_limits<int64_t>::max() ? -1 : first;
  }

  void select_rows(int64_t k) override {
    if (k == 0) return;
#pragma omp parallel if (rows_ * cols_ >= kParallelMin)
    {
      std::vector<uint64_t> keys(static_cast<size_t>(cols_));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows_; ++r) {
        const float* s = scores_.data() + r * cols_;
        for (int64_t c = 0; c < cols_; ++c) keys[static_cast<size_t>(c)] = row_key(s[c], c);
        std::nth_element(keys.begin(), keys.begin() + k, keys.end());
        uint8_t* p = mask_.row(r).data();
        for (int64_t i = 0; i < k; ++i) p[keys[static_cast<size_t>(i)] & 0xFFFFFFFFu] = 1;
      }
    }
  }

  void select_nm(int n, int m) override {
    const int64_t groups = cols_ / m;
    // Small groups (2:4, 4:8, ...): rank each entry by counting; larger M: nth_element per group.
    constexpr int kMaxCountingM = 32;
#pragma omp parallel if (rows_ * cols_ >= kParallelMin)
    {
      std::vector<uint64_t> keys(static_cast<size_t>(m));
      std::array<uint32_t, kMaxCountingM> small{};
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows_; ++r) {
        const float* s = scores_.data() + r * cols_;
        uint8_t* p = mask_.row(r).data();
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t base = g * m;
          if (m <= kMaxCountingM) {
            for (int j = 0; j < m; ++j) small[static_cast<size_t>(j)] = score_order_key(s[base + j]);
            for (int i = 0; i < m; ++i) {
              const uint32_t ki = small[static_cast<size_t>(i)];
              int rank = 0;
              for (int j = 0; j < m; ++j) {
                const uint32_t kj = small[static_cast<size_t>(j)];
                rank += (kj < ki) || (kj == ki && j < i);
              }
              p[base + i] = rank < n ? 1 : 0;
            }
          } else {
            for (int j = 0; j < m; ++j) keys[static_cast<size_t>(j)] = row_key(s[base + j], j);
            std::nth_element(keys.begin(), keys.begin() + n, keys.end());
            for (int i = 0; i < n; ++i)
              p[base + static_cast<int64_t>(keys[static_cast<size_t>(i)] & 0xFFFFFFFFu)] = 1;
          }
        }
      }
    }
  }

  void key_histogram(uint32_t prefix, uint32_t prefix_mask, int shift, std::span<int64_t> hist) override {
    const float* s = scores_.data();
    const int64_t size = scores_.numel();
    const size_t bins = hist.size();
    std::fill(hist.begin(), hist.end(), 0);
#pragma omp parallel if (size >= kParallelMin)
    {
      std::vector<int64_t> local(bins, 0);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < size; ++i) {
        const uint32_t key = score_order_key(s[i]);
        if ((key & prefix_mask) == prefix) ++local[(key >> shift) & (bins - 1)];
      }
#pragma omp critical
      for (size_t b = 0; b < bins; ++b) hist[b] += local[b];
    }
  }

  void prune_below_key(uint32_t threshold_key, std::span<int64_t> equal_in_row) override {
#pragma omp parallel for schedule(static) if (rows_ * cols_ >= kParallelMin)
    for (int64_t r = 0; r < rows_; ++r) {
      const float* s = scores_.data() + r * cols_;
      uint8_t* p = mask_.row(r).data();
      int64_t equal = 0;
      for (int64_t c = 0; c < cols_; ++c) {
        const uint32_t key = score_order_key(s[c]);
        p[c] = key < threshold_key ? 1 : 0;
        equal += key == threshold_key;
      }
      equal_in_row[static_cast<size_t>(r)] = equal;
    }
  }

  void prune_first_equal(uint32_t threshold_key, std::span<const int64_t> quota) override {
    for (int64_t r = 0; r < rows_; ++r) {
      int64_t remaining = quota[static_cast<size_t>(r)];
      const float* s = scores_.data() + r * cols_;
      uint8_t* p = mask_.row(r).data();
      for (int64_t c = 0; c < cols_ && remaining > 0; ++c)
        if (score_order_key(s[c]) == threshold_key) {
          p[c] = 1;
          --remaining;
        }
    }
  }

  void prune_at_most(float theta) override {
    const float* s = scores_.data();
    uint8_t* p = mask_.flat().data();
    const int64_t size = scores_.numel();
#pragma omp parallel for schedule(static) if (size >= kParallelMin)
    for (int64_t i = 0; i < size; ++i) p[i] = s[i] <= theta ? 1 : 0;
  }

  Mask take_mask() override {
    return std::move(mask_);
  }

 private:
  const Tensor& scores_;
  int64_t rows_, cols_;
  Mask mask_;
};

// The order key of the element at 0-based position `rank` of the ascending order of all keys, by a
// 3-pass MSB radix select (11 + 11 + 10 bits, integer histograms, so the result is thread-count
// independent). `*equal_before` receives how many elements with that key precede it in the order.
uint32_t radix_select(MaskSelector& selector, int64_t rank, int64_t* equal_before, const MatrixPart* part) {
  constexpr std::array<int, 3> kShift = {21, 10, 0};
  constexpr std::array<int, 3> kBits = {11, 11, 10};
  uint32_t prefix = 0;       // key bits fixed so far
  uint32_t prefix_mask = 0;  // which bits those are
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[static_cast<size_t>(pass)];
    const size_t bins = size_t{1} << kBits[static_cast<size_t>(pass)];
    std::vector<int64_t> hist(bins, 0);
    selector.key_histogram(prefix, prefix_mask, shift, hist);
    if (part != nullptr) part->sum_over_parts(hist);
    size_t bin = 0;
    while (rank >= hist[bin]) rank -= hist[bin++];
    SYMPRUNE_ASSERT(bin < bins, "radix select ran past the histogram");
    prefix |= static_cast<uint32_t>(bin) << shift;
    prefix_mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
  *equal_before = rank;
  return prefix;
}

void select_layer_exact(MaskSelector& selector, int64_t k, const MatrixPart* part) {
  if (k == 0) return;
  int64_t equal_to_prune = 0;
  const uint32_t threshold = radix_select(selector, k, &equal_to_prune, part);
  const int64_t rows = selector.rows();
  // Everything below the threshold key is pruned; of the entries equal to it, the first
  // `equal_to_prune` in flat order. Per-row counts of equal entries place that cut without a serial scan.
  const int64_t row_begin = part ? part->row_begin : 0;
  const int64_t total_rows = part ? part->total_rows : rows;
  std::vector<int64_t> equal_in_row(static_cast<size_t>(total_rows), 0);
  selector.prune_below_key(
      threshold,
      std::span<int64_t>(equal_in_row).subspan(static_cast<size_t>(row_begin), static_cast<size_t>(rows)));
  // Ties before this part's rows are cut first (the other parts' counts, summed in).
  if (part != nullptr) part->sum_over_parts(equal_in_row);
  int64_t remaining = equal_to_prune;
  for (int64_t r = 0; r < row_begin && remaining > 0; ++r)
    remaining -= std::min(remaining, equal_in_row[static_cast<size_t>(r)]);
  std::vector<int64_t> quota(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows && remaining > 0; ++r) {
    const int64_t take = std::min(remaining, equal_in_row[static_cast<size_t>(row_begin + r)]);
    quota[static_cast<size_t>(r)] = take;
    remaining -= take;
  }
  selector.prune_first_equal(threshold, quota);
}

// Reference repos: theta = sort(S.flatten())[k] (NaN sorts last), mask = S <= theta. A NaN theta
// (k at or past the first NaN) prunes nothing, as `S <= nan` does in torch.
void select_layer_threshold_le(MaskSelector& selector, int64_t k, const MatrixPart* part) {
  int64_t unused = 0;
  const uint32_t threshold_key = radix_select(selector, k, &unused, part);
  if (threshold_key == 0xFFFFFFFFu) return;
  selector.prune_at_most(score_from_order_key(threshold_key));
}

}  // namespace

Mask select_mask(MaskSelector& selector, const MaskSpec& spec, std::string_view matrix_name,
                 const MatrixPart* part) {
  const int64_t rows = selector.rows(), cols = selector.cols();
  const int64_t total_rows = part ? part->total_rows : rows;
  SYMPRUNE_ASSERT(
      !part || (part->row_begin >= 0 && part->row_begin + rows <= total_rows && part->sum_over_parts),
      "matrix part rows [{}, +{}) of {}", part->row_begin, rows, total_rows);
  validate_mask_spec(spec, total_rows, cols, matrix_name);
  // Row keys carry the column in 32 bits.
  SYMPRUNE_CHECK(cols < (int64_t{1} << 32), "matrix {}: row width {} is too large", matrix_name, cols);
  const bool layer = spec.kind == MaskSpec::kUnstructuredLayer;
  // A part with no rows still takes part in the layer selection's sums.
  if ((rows == 0 && !(layer && part)) || cols == 0) return selector.take_mask();
  const bool threshold_le = layer && spec.compat_threshold_le;
  if (!threshold_le) {
    const int64_t first = selector.first_nan();
    if (first >= 0)
      fail("NaN score in matrix {} (row {}, column {}); scores must be finite or infinite to select a mask",
           matrix_name, first / cols, first % cols);
  }
  switch (spec.kind) {
    case MaskSpec::kUnstructuredRow:
      selector.select_rows(prune_count(cols, spec.sparsity));
      break;
    case MaskSpec::kUnstructuredLayer: {
      const int64_t k = prune_count(total_rows * cols, spec.sparsity);
      SYMPRUNE_ASSERT(k >= 0 && k < total_rows * cols, "prune count {} of {}", k, total_rows * cols);
      if (threshold_le)
        select_layer_threshold_le(selector, k, part);
      else
        select_layer_exact(selector, k, part);
      break;
    }
    case MaskSpec::kNM:
      selector.select_nm(spec.n, spec.m);
      break;
  }
  return selector.take_mask();
}

Mask select_mask(const Tensor& scores, const MaskSpec& spec, std::string_view matrix_name,
                 const MatrixPart* part) {
  SYMPRUNE_CHECK(scores.rank() == 2, "matrix {}: scores must be a matrix, got shape {}", matrix_name,
                 scores.shape_string());
  HostMaskSelector selector(scores);
  return select_mask(selector, spec, matrix_name, part);
}

}  // namespace symprune
