#include "io/calibration.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <unordered_map>

#include "core/error.h"
#include "core/hashing.h"
#include "io/json_util.h"
#include "io/mapped_file.h"
#include "io/python_random.h"
#include "io/text_file.h"

namespace symprune::io {
namespace {

// N·T ids are held in memory (and later N·T·d hidden states), so absurd requests fail early.
constexpr int64_t kMaxCalibrationTokens = int64_t{1} << 31;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

constexpr std::string_view kWhat = "calibration file";

[[noreturn]] void fail_empty(const std::filesystem::path& path) {
  fail("{}: calibration file is empty", path.string());
}

// Reads a plain or gzip-compressed file in chunks (zlib passes non-gzip content through unchanged).
class MaybeGzipReader {
 public:
  explicit MaybeGzipReader(const std::filesystem::path& path) : path_(path) {
    const int fd = open_for_reading(path);  // a FIFO's open does not wait for a writer
    SYMPRUNE_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) pipe_fd_ = fd;
    errno = 0;
    file_ = gzdopen(fd, "rb");  // owns fd from here
    if (file_ == nullptr) ::close(fd);
    SYMPRUNE_CHECK(file_ != nullptr, "{}: cannot open: {}", path.string(),
                   errno ? std::strerror(errno) : "out of memory");
    gzbuffer(file_, 1 << 20);
  }
  ~MaybeGzipReader() {
    if (file_) gzclose(file_);
  }
  // Whether the file is gzip data (known once something was read).
  bool compressed() const { return gzdirect(file_) == 0; }
  MaybeGzipReader(const MaybeGzipReader&) = delete;
  MaybeGzipReader& operator=(const MaybeGzipReader&) = delete;

  // Appends up to `max` bytes to `out`; returns the number appended (0 at the end of the data).
  size_t read_some(std::string& out, size_t max) {
    const size_t old = out.size();
    // Before zlib's blocking read of a pipe: a writer that has not started is waited for where a signal can
    // stop the run. One that stalls part-way is not: zlib reads until its buffer is full (its reads restart
    // after a signal), so such a stop waits for the writer's next bytes, its close, or a second signal.
    if (pipe_fd_ >= 0) wait_for_pipe_data(pipe_fd_);
    out.resize(old + max);
    const int n = gzread(file_, out.data() + old, static_cast<unsigned>(max));
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file_, &code);
      SYMPRUNE_CHECK(code != Z_ERRNO, "{}: read error: {}", path_.string(), std::strerror(errno));
      fail_corrupt(message);
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) {
      // A truncated gzip stream reads as a short file; zlib reports it only through gzerror.
      int code = 0;
      const char* message = gzerror(file_, &code);
      if (code != Z_OK && code != Z_STREAM_END) fail_corrupt(message);
    }
    return static_cast<size_t>(n);
  }

  // The gzip data is cut short (an interrupted download) or damaged. zlib's message may start with the path.
  [[noreturn]] void fail_corrupt(const char* zlib_message) const {
    std::string_view reason = zlib_message ? zlib_message : "unknown zlib error";
    // zlib names the file it opened: "<fd:N>" for the descriptor it was given.
    if (reason.starts_with("<fd:")) {
      const size_t end = reason.find(">: ");
      if (end != std::string_view::npos) reason.remove_prefix(end + 3);
    }
    fail("{}: the gzip data is truncated or corrupt ({}): copy or download the file again", path_.string(),
         reason);
  }

  std::string read_all() {
    std::string out;
    while (read_some(out, 1 << 20) > 0) {
    }
    return out;
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
  int pipe_fd_ = -1;  // the descriptor zlib reads, when it is a pipe
};

// The "text" field of every non-blank line; lines are counted from 1 in errors.
std::vector<std::string> read_jsonl_texts(const std::filesystem::path& path) {
  MaybeGzipReader reader(path);
  std::vector<std::string> texts;
  std::string buffer;
  size_t begin = 0;
  uint64_t consumed = 0;  // bytes of the (decompressed) file before buffer[0]
  int64_t line_number = 0;
  bool eof = false;
  auto handle_line = [&](std::string_view line, uint64_t offset) {
    ++line_number;
    const std::string what = fmt::format("{} (line {}{})", kWhat, line_number,
                                         reader.compressed() ? ", after gzip decompression" : "");
    // Checked as text first: a UTF-16 or binary file gets its real diagnosis, not "invalid JSON".
    check_text(line, path, what, offset);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; }))
      return;
    const std::string source = fmt::format("{} line {}", path.string(), line_number);
    const nlohmann::json doc = parse_json_text(line, source);
    SYMPRUNE_CHECK(doc.is_object(), "{}: expected a JSON object with a \"text\" field", source);
    const auto it = doc.find("text");
    SYMPRUNE_CHECK(it != doc.end(), "{}: no \"text\" field", source);
    SYMPRUNE_CHECK(it->is_string(), "{}: \"text\" is not a string", source);
    texts.push_back(it->get<std::string>());
    // JSON strings are valid UTF-8, but may spell NUL as \u0000.
    check_text(texts.back(), path, fmt::format("{} (line {}, \"text\" field)", kWhat, line_number));
  };
  while (true) {
    const size_t newline = buffer.find('\n', begin);
    if (newline != std::string::npos) {
      handle_line(std::string_view(buffer).substr(begin, newline - begin), consumed + begin);
      begin = newline + 1;
      continue;
    }
    if (eof) break;
    buffer.erase(0, begin);
    consumed += begin;
    begin = 0;
    eof = reader.read_some(buffer, 1 << 20) == 0;
  }
  if (begin < buffer.size()) handle_line(std::string_view(buffer).substr(begin), consumed + begin);
  if (line_number == 0) fail_empty(path);
  SYMPRUNE_CHECK(!texts.empty(), "{}: no documents (every line is blank)", path.string());
  return texts;
}

// `by_name`: the format came from the .bin name ("auto"), so text content is refused rather than read
// as ids (with a large vocabulary, pairs of ASCII letters are mostly valid uint16 ids).
std::vector<int32_t> read_token_file(const std::filesystem::path& path, int width, int64_t vocab_size,
                                     bool by_name) {
  const std::string bytes = read_input_file(path, kWhat);
  if (bytes.empty()) fail_empty(path);
  SYMPRUNE_CHECK(
      !by_name || !looks_like_text(bytes),
      "{}: the .bin file holds text, not uint{} token ids (its bytes are printable UTF-8); give "
      "--calib-format text to tokenize it as text, or --calib-format tokens-u{} to read it as token "
      "ids anyway",
      path.string(), 8 * width, 8 * width);
  const uint64_t size = bytes.size();
  SYMPRUNE_CHECK(size % static_cast<uint64_t>(width) == 0,
                 "{}: {} bytes is not a whole number of uint{} tokens ({} bytes each)", path.string(), size,
                 8 * width, width);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t count = static_cast<size_t>(size) / static_cast<size_t>(width);
  if (by_name && width == 2 && count >= 4 && count % 2 == 0) {
    // uint32 ids below 65536 read as uint16 put a 0 at every odd position: `symprune calib --out` writes
    // uint32, and a .bin name alone says uint16.
    bool odd_all_zero = true;
    for (size_t i = 1; i < count && odd_all_zero; i += 2) odd_all_zero = p[2 * i] == 0 && p[2 * i + 1] == 0;
    SYMPRUNE_CHECK(
        !odd_all_zero,
        "{}: read as uint16 token ids (the .bin default), every second id is 0, as when the file "
        "holds uint32 ids (what `symprune calib --out` writes); give --calib-format tokens-u32 (or "
        "tokens-u16 to read it as uint16 anyway)",
        path.string());
  }
  std::vector<int32_t> ids(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t id = 0;
    for (int b = 0; b < width; ++b) id |= static_cast<uint64_t>(p[i * width + b]) << (8 * b);
    SYMPRUNE_CHECK(id < static_cast<uint64_t>(vocab_size),
                   "{}: token id {} at position {} is outside the vocabulary (size {})", path.string(), id, i,
                   vocab_size);
    ids[i] = static_cast<int32_t>(id);
  }
  return ids;
}

void check_stream_fits(const std::filesystem::path& path, int64_t length, int64_t seqlen) {
  if (length >= seqlen + 1) return;
  const std::string possible =
      length >= 2 ? fmt::format("; at most --seqlen {} would fit", length - 1) : std::string();
  fail("{}: {} tokens; a window of T={} needs at least T+1 = {} tokens, so no window fits{}", path.string(),
       length, seqlen, seqlen + 1, possible);
}

void check_ids_in_vocab(const std::filesystem::path& path, const std::vector<int32_t>& ids,
                        int64_t vocab_size) {
  for (const int32_t id : ids)
    SYMPRUNE_CHECK(id >= 0 && id < vocab_size,
                   "{}: the tokenizer produced id {}, outside the model's vocabulary (size {})",
                   path.string(), id, vocab_size);
}

// Windows of a single token stream: start_i = randint(0, L-T-1) in order.
void sample_stream(const std::vector<int32_t>& stream, const CalibrationOptions& options,
                   CalibrationSet& set) {
  PythonRandom rng(options.seed);
  const int64_t length = static_cast<int64_t>(stream.size());
  set.stream_tokens = length;
  set.documents = 1;
  for (int64_t i = 0; i < options.nsamples; ++i) {
    const int64_t start = rng.randint(0, length - options.seqlen - 1);
    set.windows.push_back({-1, start});
    set.tokens.insert(set.tokens.end(), stream.begin() + start, stream.begin() + start + options.seqlen);
  }
}

// The reference C4 loop (reference-implementations.md §1.2); see calibration.h for the guard.
void sample_documents(const std::vector<std::string>& docs, const CalibrationOptions& options,
                      const Tokenizer& tokenizer, int64_t vocab_size, CalibrationSet& set) {
  const int64_t count = static_cast<int64_t>(docs.size());
  const int64_t seqlen = options.seqlen;
  set.documents = count;
  std::vector<int64_t> lengths(docs.size(), -1);               // token count with BOS, -1 = not tokenized yet
  std::unordered_map<int64_t, std::vector<int32_t>> accepted;  // ids of documents long enough
  int64_t tokenized = 0;
  bool all_checked = false;
  const int64_t guard = 2 * count + 100;

  auto tokenize = [&](int64_t d) -> int64_t {
    if (lengths[d] >= 0) return lengths[d];
    std::vector<int32_t> ids = tokenizer.encode(docs[static_cast<size_t>(d)], /*add_bos=*/true);
    lengths[d] = static_cast<int64_t>(ids.size());
    ++tokenized;
    if (lengths[d] > seqlen) accepted.emplace(d, std::move(ids));
    return lengths[d];
  };
  auto check_some_document_fits = [&] {
    int64_t longest = 0;
    for (int64_t d = 0; d < count; ++d) longest = std::max(longest, tokenize(d));
    all_checked = true;
    if (longest > seqlen) return;
    const std::string possible =
        longest >= 2 ? fmt::format("; at most --seqlen {} would fit", longest - 1) : std::string();
    fail(
        "no document in {} has more than T={} tokens (the longest of its {} documents has {}, BOS "
        "included){}",
        options.file.string(), seqlen, count, longest, possible);
  };

  PythonRandom rng(options.seed);
  for (int64_t i = 0; i < options.nsamples; ++i) {
    int64_t rejections = 0;
    int64_t d = 0;
    while (true) {
      d = rng.randint(0, count - 1);
      if (tokenize(d) > seqlen) break;
      if (++rejections >= guard && !all_checked) check_some_document_fits();
      if (!all_checked && tokenized == count) check_some_document_fits();
    }
    const std::vector<int32_t>& ids = accepted.at(d);
    const int64_t start = rng.randint(0, static_cast<int64_t>(ids.size()) - seqlen - 1);
    set.windows.push_back({d, start});
    set.tokens.insert(set.tokens.end(), ids.begin() + start, ids.begin() + start + seqlen);
  }
  check_ids_in_vocab(options.file, set.tokens, vocab_size);
}

}  // namespace

std::string resolve_calibration_format(const std::filesystem::path& file, const std::string& format,
                                       int64_t vocab_size) {
  if (format == "jsonl" || format == "text" || format == "tokens-u16" || format == "tokens-u32")
    return format;
  SYMPRUNE_CHECK(format == "auto",
                 "{}: unknown calibration format '{}' (expected auto, jsonl, text, tokens-u16 or tokens-u32)",
                 file.string(), format);
  const std::string name = lower(file.filename().string());
  for (const char* suffix : {".jsonl", ".json", ".jsonl.gz", ".json.gz"})
    if (ends_with(name, suffix)) return "jsonl";
  if (ends_with(name, ".bin")) {
    SYMPRUNE_CHECK(vocab_size <= 65536,
                   "{}: the id width of a .bin token file is ambiguous for a vocabulary of {} ids (more than "
                   "uint16 holds); give the format explicitly: tokens-u32 (or tokens-u16)",
                   file.string(), vocab_size);
    return "tokens-u16";
  }
  return "text";
}

CalibrationSet load_calibration(const CalibrationOptions& options, const Tokenizer& tokenizer,
                                int64_t vocab_size) {
  if (vocab_size <= 0) vocab_size = tokenizer.vocab_size();
  const std::string path = options.file.string();
  // The catalogue's wording (E-CAL-NSAMPLES), as `prune` says it: these are options, not the file's fault.
  SYMPRUNE_CHECK(options.nsamples >= 1, "--nsamples must be at least 1, got {}", options.nsamples);
  SYMPRUNE_CHECK(options.seqlen >= 1, "--seqlen must be at least 1, got {}", options.seqlen);
  SYMPRUNE_CHECK(options.nsamples <= kMaxCalibrationTokens / options.seqlen,
                 "{}: --nsamples {} × --seqlen {} is more than the {} calibration tokens supported", path,
                 options.nsamples, options.seqlen, kMaxCalibrationTokens);
  const std::string format = resolve_calibration_format(options.file, options.format, vocab_size);
  check_input_file(options.file, kWhat);

  CalibrationSet set;
  set.nsamples = options.nsamples;
  set.seqlen = options.seqlen;
  set.format = format;
  set.tokens.reserve(static_cast<size_t>(options.nsamples * options.seqlen));
  if (format == "jsonl") {
    sample_documents(read_jsonl_texts(options.file), options, tokenizer, vocab_size, set);
  } else {
    std::vector<int32_t> stream;
    if (format == "text") {
      MaybeGzipReader reader(options.file);
      const std::string text = reader.read_all();
      if (text.empty()) fail_empty(options.file);
      check_text(text, options.file,
                 reader.compressed() ? "calibration file (after gzip decompression)" : kWhat);
      stream = tokenizer.encode(text, /*add_bos=*/true);
      check_ids_in_vocab(options.file, stream, vocab_size);
    } else {
      stream =
          read_token_file(options.file, format == "tokens-u16" ? 2 : 4, vocab_size, options.format == "auto");
    }
    check_stream_fits(options.file, static_cast<int64_t>(stream.size()), options.seqlen);
    sample_stream(stream, options, set);
  }
  set.fingerprint = tokens_fingerprint(set.tokens);
  return set;
}

std::string tokens_fingerprint(const std::vector<int32_t>& tokens) {
  Fnv1a64 hash;
  for (const int32_t id : tokens) hash.update_little_endian(static_cast<uint32_t>(id), 4);
  return fmt::format("{:016x}", hash.digest());
}

}  // namespace symprune::io
