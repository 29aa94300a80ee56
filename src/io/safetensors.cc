#include "io/safetensors.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "io/sharded_index.h"
#include "io/torch_checkpoint.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFileName = "model.safetensors";

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t result;
  SYMPRUNE_CHECK(!__builtin_mul_overflow(a, b, &result), "{}: size overflows 64 bits", what);
  return result;
}

uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t result;
  SYMPRUNE_CHECK(!__builtin_add_overflow(a, b, &result), "{}: size overflows 64 bits", what);
  return result;
}

// Byte count of a tensor, overflow-checked.
uint64_t tensor_byte_size(const std::vector<int64_t>& shape, DType dtype, const std::string& what) {
  uint64_t count = 1;
  for (int64_t extent : shape) {
    SYMPRUNE_CHECK(extent >= 0, "{}: negative extent in shape {}", what, shape_to_string(shape));
    count = checked_mul(count, static_cast<uint64_t>(extent), what);
  }
  count = checked_mul(count, static_cast<uint64_t>(dtype_size(dtype)), what);
  SYMPRUNE_CHECK(count <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: size overflows",
                 what);
  return count;
}

std::string conversion_hint(const fs::path& dir) {
  return fmt::format(
      "symprune reads safetensors, and of PyTorch pickles only pytorch_model.bin or its shards with "
      "pytorch_model.bin.index.json, as a state dict without running their code (other pickles can run "
      "arbitrary code when loaded). Convert once with Python, e.g.: python -c \"from transformers import "
      "AutoModelForCausalLM as M; "
      "M.from_pretrained('{0}').save_pretrained('{0}-safetensors', safe_serialization=True)\" "
      "(copy the tokenizer files too), or for a single file: python -c \"import torch, safetensors.torch as "
      "s; "
      "s.save_file({{k: v.contiguous() for k, v in torch.load('FILE.bin', map_location='cpu').items()}}, "
      "'model.safetensors', metadata={{'format': 'pt'}})\"",
      dir.string());
}

// True for the first bytes of a PyTorch checkpoint: a zip archive (torch >= 1.6) or a raw pickle.
// Only asked once a file has failed to be safetensors: a valid header length can begin with the same
// bytes (0x0280 = 640 begins 80 02, like a protocol-2 pickle).
bool looks_like_pickle(const unsigned char* head, size_t size) {
  if (size >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) return true;
  return starts_like_pickle(std::as_bytes(std::span(head, size)));
}

// SIGBUS while copying from a mapping means the file shrank under it. Copies run under a per-thread
// jump target, so the signal (delivered to the faulting thread) becomes an Error; a SIGBUS anywhere
// else gets the previous disposition back and repeats into it.
thread_local sigjmp_buf* t_sigbus_target = nullptr;
struct sigaction g_previous_sigbus {};

void on_sigbus(int, siginfo_t*, void*) {
  if (t_sigbus_target != nullptr) siglongjmp(*t_sigbus_target, 1);
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_sigbus);
  });
}

[[noreturn]] void fail_shrank(const fs::path& path, const std::string& detail) {
  fail("{}: the file shrank while it was being read (truncated or replaced during the run){}", path.string(),
       detail);
}

int64_t json_extent(const nlohmann::json& value, const std::string& what) {
  SYMPRUNE_CHECK(value.is_number_integer(), "{}: shape entries must be non-negative integers, got {}", what,
                 value.dump());
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    SYMPRUNE_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   "{}: shape entry {} too large", what, u);
    return static_cast<int64_t>(u);
  }
  const int64_t v = value.get<int64_t>();
  SYMPRUNE_CHECK(v >= 0, "{}: negative shape entry {}", what, v);
  return v;
}

uint64_t json_offset(const nlohmann::json& value, const std::string& what) {
  SYMPRUNE_CHECK(value.is_number_integer() && (value.is_number_unsigned() || value.get<int64_t>() >= 0),
                 "{}: data_offsets must be non-negative integers, got {}", what, value.dump());
  return value.get<uint64_t>();
}

}  // namespace

int64_t TensorInfo::numel() const {
  return shape_numel(shape);
}

// A shard file name from an index must stay inside the model directory. The check is lexical on
// purpose: Hugging Face cache snapshots hold symlinks into ../../blobs, which are legitimate.
void check_confined_shard_name(const std::string& name, const fs::path& index_path) {
  SYMPRUNE_CHECK(!name.empty(), "{}: empty shard file name in weight_map", index_path.string());
  SYMPRUNE_CHECK(name.find('\0') == std::string::npos, "{}: shard file name contains a NUL byte",
                 index_path.string());
  const fs::path p(name);
  SYMPRUNE_CHECK(!p.is_absolute() && !p.has_root_name() && !p.has_root_directory(),
                 "{}: shard file name '{}' is an absolute path; shards must lie inside the model directory",
                 index_path.string(), name);
  for (const auto& part : p) {
    SYMPRUNE_CHECK(part != "..",
                   "{}: shard file name '{}' leaves the model directory ('..'); shards must lie inside it",
                   index_path.string(), name);
  }
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  const std::string where = path.string();
  SafetensorsFile file;
  file.path_ = path;
  file.map_ = MappedFile::open(path);  // kept open to notice a file that shrinks under the mapping (bytes())
  const uint64_t size = file.map_.size();
  SYMPRUNE_CHECK(size >= 8, "{}: truncated safetensors file: {} bytes, less than the 8-byte header length",
                 where, size);

  // Decided by content: an 8-byte length that frames a JSON object which parses is safetensors, whatever
  // its first bytes; only a file that is not gets the pickle diagnosis.
  const auto* head = reinterpret_cast<const unsigned char*>(file.map_.data());
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | head[i];  // little-endian
  const bool framed = header_size >= 2 && header_size <= kMaxSafetensorsHeaderBytes &&
                      header_size <= size - 8 && head[8] == '{';
  const auto refuse_pickle = [&] {
    SYMPRUNE_CHECK(!looks_like_pickle(head, file.map_.size()),
                   "{}: this is a PyTorch pickle checkpoint, not safetensors. {}", where,
                   conversion_hint(path.parent_path()));
  };
  if (!framed) refuse_pickle();
  SYMPRUNE_CHECK(
      header_size <= kMaxSafetensorsHeaderBytes,
      "{}: safetensors header length {} exceeds the {}-byte limit (corrupt or not a safetensors file)", where,
      header_size, kMaxSafetensorsHeaderBytes);
  SYMPRUNE_CHECK(header_size <= size - 8,
                 "{}: truncated safetensors file: header length {} runs past the end of the {}-byte file",
                 where, header_size, size);
  SYMPRUNE_CHECK(header_size >= 2 && head[8] == '{',
                 "{}: invalid safetensors header: expected a JSON object after the 8-byte length", where);
  file.data_start_ = 8 + header_size;
  const uint64_t data_size = size - file.data_start_;

  const std::string_view header_text(reinterpret_cast<const char*>(head + 8),
                                     static_cast<size_t>(header_size));
  nlohmann::json header;
  try {
    header = parse_json_text(header_text, where + " (safetensors header)");
  } catch (const Error&) {
    refuse_pickle();
    throw;
  }
  SYMPRUNE_CHECK(header.is_object(), "{}: invalid safetensors header: not a JSON object", where);

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      SYMPRUNE_CHECK(value.is_object() || value.is_null(), "{}: __metadata__ must be an object of strings",
                     where);
      if (value.is_null()) continue;
      for (const auto& [mk, mv] : value.items()) {
        SYMPRUNE_CHECK(mv.is_string(), "{}: __metadata__ value for '{}' must be a string, got {}", where, mk,
                       mv.dump());
        file.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string what = fmt::format("{}: tensor '{}'", where, key);
    SYMPRUNE_CHECK(value.is_object(), "{}: header entry must be an object", what);
    SYMPRUNE_CHECK(value.contains("dtype") && value["dtype"].is_string(), "{}: missing or non-string dtype",
                   what);
    SYMPRUNE_CHECK(value.contains("shape") && value["shape"].is_array(), "{}: missing or non-array shape",
                   what);
    SYMPRUNE_CHECK(value.contains("data_offsets") && value["data_offsets"].is_array() &&
                       value["data_offsets"].size() == 2,
                   "{}: data_offsets must be an array [begin, end]", what);
    TensorInfo info;
    info.name = key;
    const std::string dtype = value["dtype"].get<std::string>();
    // Any byte-sized safetensors dtype is read; whether a tensor's dtype suits its use is checked where it
    // is used (load_f32, validate_model_tensors), so unused I64/F64/... tensors pass through.
    SYMPRUNE_CHECK(parse_dtype(dtype, info.dtype),
                   "{}: unknown safetensors dtype '{}' (known: F32, F16, BF16, F64, I64, U64, I32, U32, I16, "
                   "U16, I8, U8, BOOL, F8_E4M3, F8_E5M2, F8_E8M0)",
                   what, dtype);
    for (const auto& extent : value["shape"]) info.shape.push_back(json_extent(extent, what));
    info.data_begin = json_offset(value["data_offsets"][0], what);
    info.data_end = json_offset(value["data_offsets"][1], what);
    SYMPRUNE_CHECK(info.data_begin <= info.data_end, "{}: data_offsets [{}, {}] end before they begin", what,
                   info.data_begin, info.data_end);
    SYMPRUNE_CHECK(
        info.data_end <= data_size,
        "{}: data_offsets [{}, {}] run past the end of the data section ({} bytes; file truncated?)", what,
        info.data_begin, info.data_end, data_size);
    const uint64_t expected = tensor_byte_size(info.shape, info.dtype, what);
    SYMPRUNE_CHECK(info.data_end - info.data_begin == expected,
                   "{}: shape {} x {} needs {} bytes but data_offsets [{}, {}] span {} bytes", what,
                   shape_to_string(info.shape), dtype, expected, info.data_begin, info.data_end,
                   info.data_end - info.data_begin);
    file.tensors_.push_back(std::move(info));
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.name < b.name;
  });
  // In offset order the tensors must tile the data section, as the safetensors library requires: no overlap,
  // no gap, no bytes after the last (empty tensors occupy no bytes). A file that breaks this is corrupt or
  // was changed after it was written; read anyway, it would become a valid-looking pruned copy.
  // Overlaps first: a shifted tensor both leaves a gap and overlaps its neighbour, and the overlap says more.
  const TensorInfo* previous = nullptr;
  for (const auto& info : file.tensors_) {
    if (info.data_begin == info.data_end) continue;
    if (previous) {
      SYMPRUNE_CHECK(info.data_begin >= previous->data_end,
                     "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap in the data section", where,
                     previous->name, previous->data_begin, previous->data_end, info.name, info.data_begin,
                     info.data_end);
    }
    previous = &info;
  }
  uint64_t covered = 0;
  for (const auto& info : file.tensors_) {
    if (info.data_begin == info.data_end) continue;
    SYMPRUNE_CHECK(
        info.data_begin == covered,
        "{}: {} unused bytes in the data section before tensor '{}' (data_offsets [{}, {}]): the "
        "tensors must follow one another, so the file is corrupt (the safetensors library refuses it "
        "too)",
        where, info.data_begin - covered, info.name, info.data_begin, info.data_end);
    covered = info.data_end;
  }
  SYMPRUNE_CHECK(
      covered == data_size,
      "{}: {} bytes after the end of the last tensor: the file is longer than its header describes, so "
      "it is corrupt or something was appended to it (the safetensors library refuses it too)",
      where, data_size - covered);
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const auto& info : tensors_) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& info) const {
  SYMPRUNE_ASSERT(data_start_ + info.data_end <= map_.size(), "tensor {} outside the mapping", info.name);
  // Reading mapped pages past the end of a file that shrank raises SIGBUS: check before every read.
  const uint64_t now = map_.current_size(path_);
  if (now < data_start_ + info.data_end) {
    fail_shrank(path_, fmt::format(": it now has {} bytes, tensor '{}' needs {}", now, info.name,
                                   data_start_ + info.data_end));
  }
  return {map_.data() + data_start_ + info.data_begin, static_cast<size_t>(info.data_end - info.data_begin)};
}

void read_mapped(const fs::path& file, const std::function<void()>& read) {
  install_sigbus_handler();
  sigjmp_buf target;
  sigjmp_buf* const outer = t_sigbus_target;
  if (sigsetjmp(target, 1) != 0) {
    t_sigbus_target = outer;
    fail_shrank(file, "");
  }
  t_sigbus_target = &target;
  read();
  t_sigbus_target = outer;
}

void release_pages(std::span<const std::byte> mapped) {
  if (mapped.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(mapped.data()) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(mapped.data() + mapped.size());
  // Advice only: a read-only private file mapping refaults the pages from the file when touched again.
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void check_weight_dtype(const SafetensorsFile& file, const TensorInfo& info) {
  SYMPRUNE_CHECK(is_weight_dtype(info.dtype),
                 "{}: tensor '{}': unsupported dtype {} (supported: F32, F16, BF16)", file.path().string(),
                 info.name, dtype_name(info.dtype));
}

// ---------------------------------------------------------------------------------------------
// SafetensorsModel

std::vector<fs::path> index_shard_names(const fs::path& index) {
  std::set<std::string> names;
  try {
    const nlohmann::json json = read_json_file(index);
    if (json.is_object() && json.contains("weight_map") && json["weight_map"].is_object())
      for (const auto& [tensor, shard] : json["weight_map"].items())
        if (shard.is_string())
          names.insert(fs::path(shard.get<std::string>()).lexically_normal().generic_string());
  } catch (const std::exception&) {
    return {};
  }
  return {names.begin(), names.end()};
}

std::vector<fs::path> indexed_shard_files(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / kSingleFileName, ec) || !fs::is_regular_file(dir / kSafetensorsIndexFile, ec))
    return {};
  return index_shard_names(dir / kSafetensorsIndexFile);
}

SafetensorsModel SafetensorsModel::open_dir(const fs::path& dir) {
  SafetensorsModel model;
  model.dir_ = dir;
  std::error_code ec;
  SYMPRUNE_CHECK(fs::is_directory(dir, ec), "{}: model directory not found", dir.string());

  const fs::path single = dir / kSingleFileName;
  const fs::path index = dir / kSafetensorsIndexFile;
  // A link whose target is missing (a Hugging Face cache snapshot whose blob was not downloaded or was
  // removed) is named as such, not as a missing file.
  for (const fs::path& file : {single, index}) {
    if (file == index && fs::exists(single, ec)) break;  // model.safetensors takes precedence: no index read
    if (!fs::is_symlink(file, ec) || fs::exists(file, ec)) continue;
    fail(
        "{} is a symbolic link to {}, which does not exist (an incomplete download or a removed cache "
        "blob?): "
        "download the model again or repair the link",
        file.string(), fs::read_symlink(file, ec).string());
  }
  // Same precedence as transformers: model.safetensors first, then the sharded index.
  if (fs::exists(single, ec)) {
    model.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single)));
    for (const auto& info : model.files_[0]->tensors()) model.location_.emplace(info.name, 0);
    return model;
  }
  if (fs::exists(index, ec)) {
    model.sharded_ = true;
    IndexedShards<SafetensorsFile> shards = read_indexed_shards<SafetensorsFile>(dir, index);
    model.files_ = std::move(shards.files);
    model.location_ = std::move(shards.location);
    return model;
  }

  // No safetensors: name the pickle files if that is what the directory holds.
  std::vector<std::string> pickles;
  std::vector<std::string> other_safetensors;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    // llama2.c's tokenizer.bin and HF's training_args.bin are .bin files but not weights.
    const bool weights_bin = ext == ".bin" && !name.starts_with("tokenizer") && name != "training_args.bin";
    if (weights_bin || ext == ".pt" || ext == ".pth" || ext == ".ckpt" ||
        name == "pytorch_model.bin.index.json")
      pickles.push_back(name);
    if (ext == ".safetensors") other_safetensors.push_back(name);
  }
  std::sort(pickles.begin(), pickles.end());
  if (!pickles.empty()) {
    std::string list;
    for (const auto& p : pickles) {
      if (!list.empty()) list += ", ";
      list += p;
    }
    fail("{}: no safetensors weights (model.safetensors or {}); found PyTorch pickle weights ({}). {}",
         dir.string(), kSafetensorsIndexFile, list, conversion_hint(dir));
  }
  if (!other_safetensors.empty()) {
    fail("{}: no {} or {}; found other .safetensors files ({}...) but without an index they are not a model",
         dir.string(), kSingleFileName, kSafetensorsIndexFile, other_safetensors.front());
  }
  fail("{}: no model weights found: expected {}, {}, pytorch_model.bin or pytorch_model.bin.index.json",
       dir.string(), kSingleFileName, kSafetensorsIndexFile);
}

bool SafetensorsModel::contains(std::string_view name) const {
  return location_.find(name) != location_.end();
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(location_.size());
  for (const auto& [name, _] : location_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsModel::file_of(std::string_view name) const {
  const auto it = location_.find(name);
  SYMPRUNE_CHECK(it != location_.end(), "missing tensor '{}' in {}", name, dir_.string());
  return *files_[it->second];
}

const TensorInfo& SafetensorsModel::info(std::string_view name) const {
  const SafetensorsFile& file = file_of(name);
  const TensorInfo* info = file.find(name);
  SYMPRUNE_ASSERT(info != nullptr, "tensor {} indexed but not in {}", name, file.path().string());
  return *info;
}

std::span<const std::byte> SafetensorsModel::bytes(std::string_view name) const {
  const SafetensorsFile& file = file_of(name);
  return file.bytes(info(name));
}

Tensor SafetensorsModel::load_f32(std::string_view name, const std::vector<int64_t>* expected_shape) const {
  const SafetensorsFile& file = file_of(name);
  const TensorInfo& ti = info(name);
  if (expected_shape) {
    SYMPRUNE_CHECK(ti.shape == *expected_shape, "tensor '{}' in {} has shape {} but {} was expected", name,
                   file.path().string(), shape_to_string(ti.shape), shape_to_string(*expected_shape));
  }
  check_weight_dtype(file, ti);
  Tensor tensor(ti.shape);
  const auto raw = file.bytes(ti);
  if (tensor.numel() > 0)
    read_mapped(file.path(), [&] { convert_to_f32(ti.dtype, raw.data(), tensor.data(), tensor.numel()); });
  return tensor;
}

const std::map<std::string, std::string>& SafetensorsModel::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return files_.empty() ? kEmpty : files_.front()->metadata();
}

std::map<std::string, std::string> SafetensorsModel::weight_map() const {
  std::map<std::string, std::string> out;
  for (const auto& [name, i] : location_) {
    // Lexical on purpose: in the HF cache the shards are symlinks into ../../blobs.
    out[name] = files_[i]->path().lexically_relative(dir_).generic_string();
  }
  return out;
}

std::string SafetensorsModel::location(std::string_view name) const {
  return file_of(name).path().string();
}

std::string SafetensorsModel::description() const {
  return (dir_ / (sharded_ ? kSafetensorsIndexFile : kSingleFileName)).string();
}

void SafetensorsModel::read_bytes(std::string_view name, std::vector<std::byte>& out) const {
  const SafetensorsFile& file = file_of(name);
  const std::span<const std::byte> mapped = file.bytes(info(name));
  out.resize(mapped.size());
  read_mapped(file.path(), [&] { std::copy(mapped.begin(), mapped.end(), out.begin()); });
  // The pipeline reads each tensor once per pass: drop its pages from this process (they stay in the page
  // cache), so resident memory does not grow with every block read.
  release_pages(mapped);
}

std::vector<TensorSource::Shard> SafetensorsModel::shards() const {
  std::map<std::string, std::vector<std::string>> by_file;  // shard file -> its tensors
  for (const auto& [name, file] : weight_map()) by_file[file].push_back(name);
  std::vector<Shard> out;
  for (auto& [file, names] : by_file) {
    const SafetensorsFile& st = file_of(names.front());
    Shard shard{file, {}, st.metadata()};
    for (const auto& t : st.tensors())
      if (contains(t.name)) shard.tensors.push_back(t.name);
    out.push_back(std::move(shard));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

uint64_t checked_tensor_bytes(const TensorToWrite& t, const fs::path& path) {
  const std::string what = fmt::format("{}: tensor '{}'", path.string(), t.name);
  const uint64_t expected = tensor_byte_size(t.shape, t.dtype, what);
  SYMPRUNE_CHECK(t.bytes.size() == expected, "{}: shape {} x {} needs {} bytes but {} were given", what,
                 shape_to_string(t.shape), dtype_name(t.dtype), expected, t.bytes.size());
  return expected;
}

void check_names(const std::vector<TensorToWrite>& tensors, const fs::path& path) {
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    SYMPRUNE_CHECK(!t.name.empty(), "{}: empty tensor name", path.string());
    SYMPRUNE_CHECK(t.name != "__metadata__", "{}: '__metadata__' is reserved and cannot name a tensor",
                   path.string());
    SYMPRUNE_CHECK(seen.insert(t.name).second, "{}: duplicate tensor name '{}'", path.string(), t.name);
  }
}

// Removes model-*-of-*.safetensors files of an earlier save that are not in `keep`, so the directory
// describes one model only (transformers' save_pretrained cleans up the same way).
void remove_stale_shards(const fs::path& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("model-") && name.ends_with(".safetensors") &&
        name.find("-of-") != std::string::npos && std::find(keep.begin(), keep.end(), name) == keep.end()) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) fs::remove(path, ec);
}

}  // namespace

namespace {

// The header (8-byte aligned as the reference writer pads it), then each tensor's bytes from `bytes_of`.
void write_safetensors_file(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                            const std::map<std::string, std::string>& metadata,
                            const std::function<std::span<const std::byte>(size_t)>& bytes_of) {
  check_names(tensors, path);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    const uint64_t n =
        tensor_byte_size(t.shape, t.dtype, fmt::format("{}: tensor '{}'", path.string(), t.name));
    sizes.push_back(n);
    const uint64_t end = checked_add(offset, n, path.string());
    header[t.name] = {
        {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  SYMPRUNE_CHECK(header_text.size() <= kMaxSafetensorsHeaderBytes,
                 "{}: header of {} bytes exceeds the {}-byte limit", path.string(), header_text.size(),
                 kMaxSafetensorsHeaderBytes);

  write_file_atomically(path, [&](int fd, const fs::path& target) {
    unsigned char length[8];
    uint64_t n = header_text.size();
    for (int i = 0; i < 8; ++i, n >>= 8) length[i] = static_cast<unsigned char>(n & 0xff);
    write_all(fd, length, 8, target);
    write_all(fd, header_text.data(), header_text.size(), target);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::span<const std::byte> bytes = bytes_of(i);
      SYMPRUNE_CHECK(bytes.size() == sizes[i], "{}: tensor '{}' has {} bytes, its shape needs {}",
                     path.string(), tensors[i].name, bytes.size(), sizes[i]);
      write_all(fd, bytes.data(), bytes.size(), target);
    }
  });
}

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& t : tensors) checked_tensor_bytes(t, path);
  write_safetensors_file(path, tensors, metadata, [&](size_t i) { return tensors[i].bytes; });
}

void write_safetensors_streamed(
    const fs::path& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata,
    const std::function<void(size_t index, std::vector<std::byte>& bytes)>& fill) {
  std::vector<std::byte> buffer;
  write_safetensors_file(path, tensors, metadata, [&](size_t i) {
    fill(i, buffer);
    return std::span<const std::byte>(buffer);
  });
}

std::vector<std::string> write_safetensors_sharded(const fs::path& dir,
                                                   const std::vector<TensorToWrite>& tensors,
                                                   const std::map<std::string, std::string>& metadata,
                                                   uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SYMPRUNE_CHECK(!ec, "{}: cannot create the output directory: {}", dir.string(), ec.message());
  check_names(tensors, dir / kSingleFileName);
  SYMPRUNE_CHECK(max_shard_bytes > 0, "{}: max shard size must be positive", dir.string());

  // Greedy grouping in the given order, as transformers' shard_checkpoint does: a tensor that does not
  // fit starts a new shard; a single tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<size_t>> groups;
  uint64_t total = 0;
  uint64_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = checked_tensor_bytes(tensors[i], dir / tensors[i].name);
    total = checked_add(total, n, dir.string());
    if (groups.empty() || (current + n > max_shard_bytes && current > 0)) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(i);
    current += n;
  }
  if (groups.empty()) groups.emplace_back();

  std::vector<std::string> written;
  if (groups.size() == 1) {
    write_safetensors(dir / kSingleFileName, tensors, metadata);
    written.push_back(kSingleFileName);
    fs::remove(dir / kSafetensorsIndexFile, ec);  // a stale index would describe other shards
    remove_stale_shards(dir, written);
    return written;
  }

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", g + 1, groups.size());
    std::vector<TensorToWrite> shard;
    shard.reserve(groups[g].size());
    for (size_t i : groups[g]) {
      shard.push_back(tensors[i]);
      sorted_map[tensors[i].name] = name;
    }
    write_safetensors(dir / name, shard, metadata);
    written.push_back(name);
  }
  for (const auto& [k, v] : sorted_map) weight_map[k] = v;
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", std::move(weight_map)}};
  const std::string index_text = index.dump(2) + "\n";
  write_file_atomically(dir / kSafetensorsIndexFile, [&](int fd, const fs::path& target) {
    write_all(fd, index_text.data(), index_text.size(), target);
  });
  // transformers loads model.safetensors before the index, so a stale single file must go, as must
  // shards of an earlier save with a different count.
  fs::remove(dir / kSingleFileName, ec);
  remove_stale_shards(dir, written);
  written.push_back(kSafetensorsIndexFile);
  return written;
}

}  // namespace symprune::io
