// PyTorch checkpoints (io/torch_checkpoint.h): the zip directory reader, the restricted unpickler, strided
// views gathered from their storages, and the directory-level model. Archives and pickles are assembled
// here byte by byte, in the shapes torch.save writes (no Python or torch at test time); every refusal is
// checked by its message.
#include "io/torch_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// Expects `fn` to throw symprune::Error whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "expected symprune::Error";
  } catch (const Error& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string as_string(const std::vector<std::byte>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::string le(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i, value >>= 8) out += static_cast<char>(value & 0xff);
  return out;
}

// Little-endian fp32 bytes of `values`.
std::string f32(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// 0, 1, ..., n-1 as fp32 bytes.
std::string f32_iota(int n) {
  std::vector<float> values;
  for (int i = 0; i < n; ++i) values.push_back(static_cast<float>(i));
  return f32(values);
}

// 16-bit patterns (fp16 / bf16 storages: the reader copies bytes, it never converts them).
std::string u16(const std::vector<uint16_t>& values) {
  std::string out;
  for (uint16_t v : values) out += le(v, 2);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Pickle builder: one method per opcode (pickletools names in the comments).

class Pickle {
 public:
  explicit Pickle(int protocol = 2) {
    if (protocol >= 2) op(0x80).byte(protocol);  // PROTO
  }
  Pickle& op(unsigned char c) { return byte(c); }
  Pickle& byte(int b) {
    bytes_ += static_cast<char>(b);
    return *this;
  }
  Pickle& raw(std::string_view s) {
    bytes_ += s;
    return *this;
  }
  Pickle& mark() { return op('('); }
  Pickle& stop() { return op('.'); }
  Pickle& tuple() { return op('t'); }
  Pickle& empty_tuple() { return op(')'); }
  Pickle& empty_dict() { return op('}'); }
  Pickle& empty_list() { return op(']'); }
  Pickle& reduce() { return op('R'); }
  Pickle& build() { return op('b'); }
  Pickle& setitem() { return op('s'); }
  Pickle& setitems() { return op('u'); }
  Pickle& append() { return op('a'); }
  Pickle& binpersid() { return op('Q'); }
  Pickle& newfalse() { return op(0x89); }
  Pickle& memoize() { return op(0x94); }
  Pickle& stack_global() { return op(0x93); }
  Pickle& frame(uint64_t length) { return op(0x95).raw(le(length, 8)); }
  Pickle& global(std::string_view module, std::string_view name) {  // GLOBAL
    return op('c').raw(module).raw("\n").raw(name).raw("\n");
  }
  Pickle& unicode(std::string_view s) { return op('X').raw(le(s.size(), 4)).raw(s); }  // BINUNICODE
  Pickle& short_unicode(std::string_view s) {                                          // SHORT_BINUNICODE
    return op(0x8c).byte(static_cast<int>(s.size())).raw(s);
  }
  Pickle& integer(int64_t v) {  // BININT1 / BININT2 / BININT / LONG1, as pickle chooses
    if (v >= 0 && v < 0x100) return op('K').byte(static_cast<int>(v));
    if (v >= 0 && v < 0x10000) return op('M').raw(le(static_cast<uint64_t>(v), 2));
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').raw(le(static_cast<uint32_t>(v), 4));
    return op(0x8a).byte(8).raw(le(static_cast<uint64_t>(v), 8));
  }
  Pickle& ints(const std::vector<int64_t>& values) {  // a tuple of ints: TUPLE1..3 or MARK ... TUPLE
    if (values.empty()) return empty_tuple();
    if (values.size() > 3) mark();
    for (int64_t v : values) integer(v);
    return values.size() > 3 ? tuple() : op(static_cast<unsigned char>(0x84 + values.size()));
  }
  Pickle& put(int key) { return key < 0x100 ? op('q').byte(key) : op('r').raw(le(key, 4)); }  // BINPUT
  Pickle& get(int key) { return key < 0x100 ? op('h').byte(key) : op('j').raw(le(key, 4)); }  // BINGET

  const std::string& str() const { return bytes_; }
  std::span<const std::byte> span() const { return as_bytes(bytes_); }

 private:
  std::string bytes_;
};

// One tensor of a state dict: a view of storage `key`.
struct TensorSpec {
  std::string name;
  std::string key;
  std::string storage_type = "FloatStorage";
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  // The storage's element count in the persistent id; unset: checkpoint_bytes() takes it from the record.
  std::optional<int64_t> storage_numel;
};

std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = step;
    step *= shape[d];
  }
  return stride;
}

// A view of fp32 storage `key`: `offset`, `shape` and `stride` in elements.
TensorSpec view(std::string name, std::string key, int64_t offset, std::vector<int64_t> shape,
                std::vector<int64_t> stride) {
  TensorSpec t;
  t.name = std::move(name);
  t.key = std::move(key);
  t.offset = offset;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  return t;
}

// A row-major tensor over storage `key`.
TensorSpec contiguous(std::string name, std::string key, std::vector<int64_t> shape,
                      std::string storage_type = "FloatStorage", int64_t offset = 0) {
  TensorSpec t = view(std::move(name), std::move(key), offset, shape, row_major(shape));
  t.storage_type = std::move(storage_type);
  return t;
}

int64_t storage_element_size(const std::string& storage_type) {
  static const std::map<std::string, int64_t> kSizes = {
      {"FloatStorage", 4}, {"HalfStorage", 2}, {"BFloat16Storage", 2}, {"DoubleStorage", 8},
      {"LongStorage", 8},  {"IntStorage", 4},  {"ShortStorage", 2},    {"CharStorage", 1},
      {"ByteStorage", 1},  {"BoolStorage", 1}};
  return kSizes.at(storage_type);
}

// Emits objects the way Python's pickler does for torch.save: each new object is memoized (BINPUT), and
// globals and strings seen before are fetched from the memo (BINGET).
class TorchPickler {
 public:
  Pickle& p() { return p_; }
  void put() { p_.put(next_++); }
  void global(const std::string& module, const std::string& name) {
    memoized("g:" + module + "." + name, [&] { p_.global(module, name); });
  }
  void string(const std::string& s) {
    memoized("s:" + s, [&] { p_.unicode(s); });
  }
  void ordered_dict() {  // collections.OrderedDict()
    global("collections", "OrderedDict");
    p_.empty_tuple().reduce();
    put();
  }

 private:
  template <typename Emit>
  void memoized(const std::string& key, Emit emit) {
    const auto it = memo_.find(key);
    if (it != memo_.end()) {
      p_.get(it->second);
      return;
    }
    emit();
    memo_[key] = next_;
    put();
  }
  Pickle p_{2};
  std::map<std::string, int> memo_;
  int next_ = 0;
};

// The data.pkl that torch.save(model.state_dict()) writes (protocol 2): an OrderedDict of
// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict()) calls whose storages
// are persistent ids ('storage', torch.<Type>Storage, key, 'cpu', numel); with `metadata`, the
// `_metadata` attribute as the BUILD state nn.Module.state_dict() leaves on it.
std::string torch_pickle(const std::vector<TensorSpec>& tensors, bool metadata = true) {
  TorchPickler tp;
  Pickle& p = tp.p();
  tp.ordered_dict();
  p.mark();
  for (const auto& t : tensors) {
    tp.string(t.name);
    tp.global("torch._utils", "_rebuild_tensor_v2");
    p.mark();
    p.mark();
    tp.string("storage");
    tp.global("torch", t.storage_type);
    tp.string(t.key);
    tp.string("cpu");
    p.integer(t.storage_numel.value_or(0)).tuple();
    tp.put();
    p.binpersid();
    p.integer(t.offset);
    p.ints(t.shape);
    tp.put();
    p.ints(t.stride);
    tp.put();
    p.newfalse();
    tp.ordered_dict();
    p.tuple();
    tp.put();
    p.reduce();
    tp.put();
  }
  p.setitems();
  if (metadata) {
    p.empty_dict();
    tp.put();
    tp.string("_metadata");
    tp.ordered_dict();
    p.mark();
    tp.string("");
    p.empty_dict();
    tp.put();
    tp.string("version");
    p.integer(1).setitem();
    p.setitems();
    p.setitem();
    p.build();
  }
  p.stop();
  return p.str();
}

// ---------------------------------------------------------------------------------------------
// Zip builder: stored records, local headers, central directory, end record (optionally ZIP64).

// CRC-32 (zip's polynomial, bitwise): the reader does not check it; it keeps the archives valid zips.
uint32_t crc32(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (char c : data) {
    crc ^= static_cast<unsigned char>(c);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

struct ZipEntry {
  std::string name;
  std::string data;
  uint16_t method = 0;
  int64_t declared_size = -1;  // the size both headers state; -1: data.size()
  bool bad_local_signature = false;
  bool bad_directory_signature = false;
};

struct ZipOptions {
  ZipOptions& with_zip64(bool on = true) {
    zip64 = on;
    return *this;
  }
  ZipOptions& aligned_to(uint64_t bytes) {
    align = bytes;
    return *this;
  }
  ZipOptions& with_comment(std::string text) {
    comment = std::move(text);
    return *this;
  }

  // ZIP64: every central-directory entry holds 0xffffffff placeholders for its sizes and local-header
  // offset, widened by a ZIP64 extra field, and the end record points to a ZIP64 end record + locator.
  bool zip64 = false;
  uint64_t align = 0;  // as torch: records padded (local extra field "FB") to start at multiples of this
  std::string comment;
};

struct Zip {
  std::string bytes;
  std::vector<uint64_t> data_offsets;  // of each entry's first data byte
  uint64_t directory_offset = 0;
  uint64_t end_offset = 0;  // of the (32-bit) end-of-central-directory record
};

Zip build_zip(const std::vector<ZipEntry>& entries, const ZipOptions& options = {}) {
  Zip zip;
  std::string& out = zip.bytes;
  std::vector<uint64_t> local_offsets;
  for (const auto& e : entries) {
    const uint64_t size = e.declared_size < 0 ? e.data.size() : static_cast<uint64_t>(e.declared_size);
    local_offsets.push_back(out.size());
    std::string extra;
    if (options.zip64) extra += le(1, 2) + le(16, 2) + le(size, 8) + le(size, 8);
    if (options.align > 0) {
      const uint64_t unpadded = out.size() + 30 + e.name.size() + extra.size() + 4;
      const uint64_t pad = (options.align - unpadded % options.align) % options.align;
      extra += "FB" + le(pad, 2) + std::string(pad, 'Z');
    }
    out += le(e.bad_local_signature ? 0x04034b51 : 0x04034b50, 4);
    out += le(options.zip64 ? 45 : 20, 2) + le(0, 2) + le(e.method, 2) + le(0, 2) + le(0, 2);
    out += le(crc32(e.data), 4);
    const uint64_t size32 = options.zip64 ? 0xffffffffu : size;
    out += le(size32, 4) + le(size32, 4) + le(e.name.size(), 2) + le(extra.size(), 2) + e.name + extra;
    zip.data_offsets.push_back(out.size());
    out += e.data;
  }
  zip.directory_offset = out.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = entries[i];
    const uint64_t size = e.declared_size < 0 ? e.data.size() : static_cast<uint64_t>(e.declared_size);
    std::string extra;
    if (options.zip64) {
      // An unrelated extended-timestamp field first: the reader must walk the extra fields.
      extra += le(0x5455, 2) + le(5, 2) + std::string("\x01\x00\x00\x00\x00", 5);
      extra += le(1, 2) + le(24, 2) + le(size, 8) + le(size, 8) + le(local_offsets[i], 8);
    }
    const uint64_t size32 = options.zip64 ? 0xffffffffu : size;
    const uint64_t local32 = options.zip64 ? 0xffffffffu : local_offsets[i];
    out += le(e.bad_directory_signature ? 0x02014b51 : 0x02014b50, 4);
    out += le(options.zip64 ? 45 : 20, 2) + le(options.zip64 ? 45 : 20, 2) + le(0, 2) + le(e.method, 2);
    out += le(0, 2) + le(0, 2) + le(crc32(e.data), 4) + le(size32, 4) + le(size32, 4);
    out += le(e.name.size(), 2) + le(extra.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4);
    out += le(local32, 4) + e.name + extra;
  }
  const uint64_t directory_size = out.size() - zip.directory_offset;
  if (options.zip64) {
    const uint64_t record = out.size();
    out += le(0x06064b50, 4) + le(44, 8) + le(45, 2) + le(45, 2) + le(0, 4) + le(0, 4);
    out += le(entries.size(), 8) + le(entries.size(), 8);
    out += le(directory_size, 8) + le(zip.directory_offset, 8);
    out += le(0x07064b50, 4) + le(0, 4) + le(record, 8) + le(1, 4);
  }
  zip.end_offset = out.size();
  out += le(0x06054b50, 4) + le(0, 2) + le(0, 2);
  if (options.zip64) {
    out += le(0xffff, 2) + le(0xffff, 2) + le(0xffffffffu, 4) + le(0xffffffffu, 4);
  } else {
    out += le(entries.size(), 2) + le(entries.size(), 2);
    out += le(directory_size, 4) + le(zip.directory_offset, 4);
  }
  out += le(options.comment.size(), 2) + options.comment;
  return zip;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint builder: the records torch.save writes into its archive.

struct Checkpoint {
  std::string prefix = "archive";
  std::vector<TensorSpec> tensors;
  std::map<std::string, std::string> storages;  // key -> bytes of record PREFIX/data/KEY
  std::string byteorder = "little";             // empty: no byteorder record (torch < 1.10)
  bool zip64 = false;
  std::string pickle;  // data.pkl; empty: torch_pickle(tensors)
};

std::string checkpoint_bytes(Checkpoint c) {
  for (auto& t : c.tensors) {
    const auto it = c.storages.find(t.key);
    if (it != c.storages.end() && !t.storage_numel)
      t.storage_numel = static_cast<int64_t>(it->second.size()) / storage_element_size(t.storage_type);
  }
  std::vector<ZipEntry> entries;
  entries.push_back({c.prefix + "/data.pkl", c.pickle.empty() ? torch_pickle(c.tensors) : c.pickle});
  if (!c.byteorder.empty()) entries.push_back({c.prefix + "/byteorder", c.byteorder});
  for (const auto& [key, bytes] : c.storages) entries.push_back({c.prefix + "/data/" + key, bytes});
  entries.push_back({c.prefix + "/version", "3\n"});
  entries.push_back({c.prefix + "/.data/serialization_id", "1234567890123456789012345678901234567890"});
  return build_zip(entries, ZipOptions().with_zip64(c.zip64).aligned_to(64)).bytes;
}

// A 2x3 fp32 weight "w" (0..5) in storage "0".
Checkpoint small_checkpoint() {
  Checkpoint c;
  c.tensors = {contiguous("w", "0", {2, 3})};
  c.storages = {{"0", f32_iota(6)}};
  return c;
}

// ---------------------------------------------------------------------------------------------
// read_zip_records

TEST(TorchCheckpointZip, PlainArchiveListsNamesOffsetsAndSizes) {
  const std::vector<ZipEntry> entries = {
      {"archive/data.pkl", "pickle bytes"}, {"archive/data/0", std::string(100, 'x')}, {"archive/empty", ""}};
  const Zip zip = build_zip(entries, ZipOptions().aligned_to(64));
  const auto records = read_zip_records(as_bytes(zip.bytes), "a.bin");
  ASSERT_EQ(records.size(), 3u);
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    EXPECT_EQ(records[i].name, entries[i].name);
    EXPECT_EQ(records[i].offset, zip.data_offsets[i]);
    EXPECT_EQ(records[i].offset % 64, 0u) << "the local header's own extra field (torch's padding) counts";
    EXPECT_EQ(records[i].size, entries[i].data.size());
    EXPECT_EQ(zip.bytes.substr(records[i].offset, records[i].size), entries[i].data);
  }
}

TEST(TorchCheckpointZip, Zip64ArchiveWidensSizesAndOffsetsFromExtraFields) {
  const std::vector<ZipEntry> entries = {{"archive/data.pkl", "p"},
                                         {"archive/data/0", std::string(300, 'y')}};
  const Zip zip = build_zip(entries, ZipOptions().with_zip64());
  // The 32-bit fields really are placeholders: the plain reading would be wrong.
  ASSERT_EQ(zip.bytes.substr(zip.end_offset + 8, 2), le(0xffff, 2));
  const auto records = read_zip_records(as_bytes(zip.bytes), "a.bin");
  ASSERT_EQ(records.size(), 2u);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].name, entries[i].name);
    EXPECT_EQ(records[i].offset, zip.data_offsets[i]);
    EXPECT_EQ(records[i].size, entries[i].data.size());
  }
}

TEST(TorchCheckpointZip, ArchiveCommentIsSkippedWhenFindingTheEndRecord) {
  // The comment itself holds an end-record signature: only the record whose comment ends the file counts.
  const std::string comment = "PK\x05\x06" + std::string(40, 'c');
  const Zip zip = build_zip({{"x", "abc"}}, ZipOptions().with_comment(comment));
  const auto records = read_zip_records(as_bytes(zip.bytes), "a.bin");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].name, "x");
  EXPECT_EQ(records[0].offset, zip.data_offsets[0]);
}

TEST(TorchCheckpointZip, EmptyArchiveHasNoRecords) {
  EXPECT_TRUE(read_zip_records(as_bytes(build_zip({}).bytes), "a.bin").empty());
}

TEST(TorchCheckpointZip, CompressedRecordIsRefused) {
  const Zip zip = build_zip({{"archive/data.pkl", "p"}, {"archive/data/0", "abcd", /*method=*/8}});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "m.bin"); },
               {"m.bin", "'archive/data/0'", "compressed", "method 8"});
}

TEST(TorchCheckpointZip, FileShorterThanAnEndRecordIsRefused) {
  expect_error([] { read_zip_records(as_bytes(std::string("PK\x03\x04 short")), "s.bin"); },
               {"s.bin", "not a zip archive", "shorter than its end record"});
}

TEST(TorchCheckpointZip, MissingEndRecordIsRefused) {
  Zip zip = build_zip({{"a", "1234"}});
  zip.bytes[zip.end_offset] = 'X';  // the end record's signature
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "e.bin"); },
               {"e.bin", "no end-of-central-directory record"});
}

TEST(TorchCheckpointZip, ArchiveCutShortLosesItsEndRecord) {
  const Zip zip = build_zip({{"a", std::string(40, 'a')}, {"b", "bb"}});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes.substr(0, zip.bytes.size() - 1)), "t.bin"); },
               {"t.bin", "no end-of-central-directory record"});
}

TEST(TorchCheckpointZip, EveryPrefixOfAnArchiveIsRefusedNotCrashed) {
  for (const bool zip64 : {false, true}) {
    const Zip zip = build_zip({{"archive/data.pkl", "pkl"}, {"archive/data/0", std::string(9, 'q')}},
                              ZipOptions().with_zip64(zip64));
    for (size_t n = 0; n < zip.bytes.size(); ++n)
      EXPECT_THROW(read_zip_records(as_bytes(zip.bytes.substr(0, n)), "p.bin"), Error)
          << n << " bytes, zip64 " << zip64;
  }
}

TEST(TorchCheckpointZip, RecordDataPastTheEndIsRefused) {
  const Zip zip = build_zip({{"archive/data/0", "abcd", 0, /*declared_size=*/100000}});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "d.bin"); },
               {"d.bin", "record data", "runs past the end"});
}

TEST(TorchCheckpointZip, DuplicateRecordNamesAreRefused) {
  const Zip zip = build_zip({{"archive/data/0", "abcd"}, {"archive/data/0", "efgh"}});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "dup.bin"); },
               {"dup.bin", "'archive/data/0'", "appears twice"});
}

TEST(TorchCheckpointZip, BadLocalHeaderSignatureIsRefused) {
  ZipEntry bad{"archive/data/1", "efgh"};
  bad.bad_local_signature = true;
  const Zip zip = build_zip({{"archive/data/0", "abcd"}, bad});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "l.bin"); },
               {"l.bin", "'archive/data/1'", "no local header", std::to_string(zip.data_offsets[0] + 4)});
}

TEST(TorchCheckpointZip, BadDirectoryEntrySignatureIsRefused) {
  ZipEntry bad{"archive/data/1", "efgh"};
  bad.bad_directory_signature = true;
  const Zip zip = build_zip({{"archive/data/0", "abcd"}, bad});
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "c.bin"); },
               {"c.bin", "directory entry 1 has no signature"});
}

TEST(TorchCheckpointZip, DirectoryPastTheEndIsRefused) {
  Zip zip = build_zip({{"a", "1234"}});
  zip.bytes.replace(zip.end_offset + 16, 4, le(zip.bytes.size(), 4));  // directory offset
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "o.bin"); },
               {"o.bin", "central directory", "runs past the end"});
}

TEST(TorchCheckpointZip, MoreEntriesThanTheDirectoryHoldsAreRefused) {
  Zip zip = build_zip({{"a", "1234"}});
  zip.bytes.replace(zip.end_offset + 10, 2, le(500, 2));  // entry count
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "n.bin"); }, {"n.bin", "500 entries"});
}

TEST(TorchCheckpointZip, Zip64PlaceholdersWithoutLocatorAreRefused) {
  Zip zip = build_zip({{"a", "1234"}});
  zip.bytes.replace(zip.end_offset + 16, 4, le(0xffffffffu, 4));
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "z.bin"); },
               {"z.bin", "ZIP64 sizes without a ZIP64 locator"});
}

TEST(TorchCheckpointZip, Zip64LocatorPointingAtNoRecordIsRefused) {
  Zip zip = build_zip({{"a", "1234"}}, ZipOptions().with_zip64());
  zip.bytes.replace(zip.end_offset - 20 + 8, 8, le(0, 8));  // the locator's ZIP64 end record offset
  expect_error([&] { read_zip_records(as_bytes(zip.bytes), "z.bin"); },
               {"z.bin", "no ZIP64 end record at byte 0"});
}

// ---------------------------------------------------------------------------------------------
// unpickle_state_dict

std::vector<TorchTensorRef> unpickle(const std::string& pickle) {
  return unpickle_state_dict(as_bytes(pickle), "data.pkl");
}

TEST(TorchCheckpointPickle, TorchSaveShapedPickleGivesEveryFieldInDictOrder) {
  TensorSpec transposed{"b.t", "1", "HalfStorage", 0, {3, 2}, {1, 3}, 6};
  TensorSpec offset{"a.view", "2", "BFloat16Storage", 5, {2, 2}, {4, 1}, 16};
  TensorSpec first = contiguous("z.weight", "0", {4, 8});
  first.storage_numel = 32;
  const std::vector<TensorSpec> specs = {first, transposed, offset, contiguous("scalar", "3", {})};
  const auto refs = unpickle(torch_pickle(specs, /*metadata=*/false));
  ASSERT_EQ(refs.size(), 4u);
  // The dict's order, not sorted by name.
  EXPECT_EQ(refs[0].name, "z.weight");
  EXPECT_EQ(refs[0].storage, "0");
  EXPECT_EQ(refs[0].dtype, DType::kF32);
  EXPECT_EQ(refs[0].storage_numel, 32);
  EXPECT_EQ(refs[0].storage_offset, 0);
  EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(refs[0].stride, (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(refs[1].name, "b.t");
  EXPECT_EQ(refs[1].storage, "1");
  EXPECT_EQ(refs[1].dtype, DType::kF16);
  EXPECT_EQ(refs[1].storage_numel, 6);
  EXPECT_EQ(refs[1].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(refs[1].stride, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(refs[2].name, "a.view");
  EXPECT_EQ(refs[2].storage, "2");
  EXPECT_EQ(refs[2].dtype, DType::kBF16);
  EXPECT_EQ(refs[2].storage_numel, 16);
  EXPECT_EQ(refs[2].storage_offset, 5);
  EXPECT_EQ(refs[2].stride, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(refs[3].name, "scalar");
  EXPECT_TRUE(refs[3].shape.empty());
  EXPECT_TRUE(refs[3].stride.empty());
}

TEST(TorchCheckpointPickle, MetadataBuildStateOnTheOrderedDictIsAccepted) {
  const std::string pickle = torch_pickle({contiguous("w", "0", {2})}, /*metadata=*/true);
  ASSERT_NE(pickle.find("_metadata"), std::string::npos);
  const auto refs = unpickle(pickle);
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0].name, "w");
  EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{2}));
}

TEST(TorchCheckpointPickle, LargeIntegersAndLongMemoKeysAreRead) {
  // 300 tensors: memo keys past 255 (LONG_BINPUT / LONG_BINGET); sizes and offsets in BININT2 and BININT.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 300; ++i)
    specs.push_back(
        contiguous("t" + std::to_string(i), std::to_string(i), {i + 1, 70000}, "FloatStorage", i * 1000));
  const std::string pickle = torch_pickle(specs);
  ASSERT_NE(pickle.find("r" + le(256, 4)), std::string::npos);  // LONG_BINPUT 256
  const auto refs = unpickle(pickle);
  ASSERT_EQ(refs.size(), 300u);
  EXPECT_EQ(refs[299].name, "t299");
  EXPECT_EQ(refs[299].storage, "299");
  EXPECT_EQ(refs[299].storage_offset, 299000);
  EXPECT_EQ(refs[299].shape, (std::vector<int64_t>{300, 70000}));
  EXPECT_EQ(refs[299].stride, (std::vector<int64_t>{70000, 1}));
}

TEST(TorchCheckpointPickle, AllStorageTypesMapToTheirDtypes) {
  const std::vector<std::pair<std::string, DType>> types = {
      {"FloatStorage", DType::kF32},  {"HalfStorage", DType::kF16}, {"BFloat16Storage", DType::kBF16},
      {"DoubleStorage", DType::kF64}, {"LongStorage", DType::kI64}, {"IntStorage", DType::kI32},
      {"ShortStorage", DType::kI16},  {"CharStorage", DType::kI8},  {"ByteStorage", DType::kU8},
      {"BoolStorage", DType::kBool}};
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < types.size(); ++i)
    specs.push_back(contiguous(types[i].first, std::to_string(i), {3}, types[i].first));
  const auto refs = unpickle(torch_pickle(specs));
  ASSERT_EQ(refs.size(), types.size());
  for (size_t i = 0; i < types.size(); ++i) EXPECT_EQ(refs[i].dtype, types[i].second) << types[i].first;
}

// Protocol 4 (torch.save(..., pickle_protocol=4)): FRAME, SHORT_BINUNICODE, STACK_GLOBAL, MEMOIZE.
TEST(TorchCheckpointPickle, Protocol4FormsAreRead) {
  Pickle body(0);
  int memo = 0;
  const auto memoize = [&] {
    body.memoize();
    return memo++;
  };
  body.short_unicode("collections");
  memoize();
  body.short_unicode("OrderedDict");
  memoize();
  body.stack_global();
  const int ordered_dict = memoize();
  body.empty_tuple().reduce();
  memoize();
  body.mark().short_unicode("w");
  memoize();
  body.short_unicode("torch._utils");
  memoize();
  body.short_unicode("_rebuild_tensor_v2");
  memoize();
  body.stack_global();
  memoize();
  body.mark().mark().short_unicode("storage");
  memoize();
  body.short_unicode("torch");
  memoize();
  body.short_unicode("HalfStorage");
  memoize();
  body.stack_global();
  memoize();
  body.short_unicode("k7");
  memoize();
  body.short_unicode("cpu");
  memoize();
  body.integer(6).tuple();
  memoize();
  body.binpersid().integer(2).ints({2, 2});
  memoize();
  body.ints({1, 2});
  memoize();
  body.newfalse().get(ordered_dict).empty_tuple().reduce();
  memoize();
  body.tuple();
  memoize();
  body.reduce();
  memoize();
  body.setitems().stop();
  Pickle pickle(4);
  pickle.frame(body.str().size()).raw(body.str());

  const auto refs = unpickle(pickle.str());
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0].name, "w");
  EXPECT_EQ(refs[0].storage, "k7");
  EXPECT_EQ(refs[0].dtype, DType::kF16);
  EXPECT_EQ(refs[0].storage_offset, 2);
  EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(refs[0].stride, (std::vector<int64_t>{1, 2}));
}

// The persistent id of storage `key` (torch.FloatStorage), numel 4.
Pickle& storage_pid(Pickle& p, const std::string& key) {
  return p.mark()
      .unicode("storage")
      .global("torch", "FloatStorage")
      .unicode(key)
      .unicode("cpu")
      .integer(4)
      .tuple()
      .binpersid();
}

// _rebuild_tensor_v2(<storage key>, 0, (2,), (1,), False, OrderedDict()), left on the stack.
Pickle& rebuild_tensor(Pickle& p, const std::string& key) {
  p.global("torch._utils", "_rebuild_tensor_v2").mark();
  storage_pid(p, key).integer(0).ints({2}).ints({1}).newfalse();
  return p.global("collections", "OrderedDict").empty_tuple().reduce().tuple().reduce();
}

// {name: tensor, ...} as a plain dict (EMPTY_DICT ... SETITEMS).
std::string plain_dict_of_tensors(const std::vector<std::string>& names) {
  Pickle p;
  p.empty_dict().mark();
  for (const auto& name : names) rebuild_tensor(p.unicode(name), "0");
  return p.setitems().stop().str();
}

TEST(TorchCheckpointPickle, PlainDictAndRebuildParameterAreAccepted) {
  Pickle p;
  p.empty_dict().unicode("p");
  p.global("torch._utils", "_rebuild_parameter").mark();
  rebuild_tensor(p, "5").newfalse().global("collections", "OrderedDict").empty_tuple().reduce().tuple();
  p.reduce().setitem().stop();
  const auto refs = unpickle(p.str());
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0].name, "p");
  EXPECT_EQ(refs[0].storage, "5");
  EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{2}));
}

// _rebuild_from_type_v2(func, type, args, state): how torch >= 2 pickles a tensor of type torch.Tensor
// that carries Python state; only Tensor and Parameter types are read.
std::string rebuild_from_type(const std::string& type_module, const std::string& type_name) {
  Pickle p;
  p.empty_dict().unicode("w").global("torch._tensor", "_rebuild_from_type_v2").mark();
  p.global("torch._utils", "_rebuild_tensor_v2").global(type_module, type_name).mark();
  storage_pid(p, "9").integer(1).ints({3}).ints({1}).newfalse().empty_dict().tuple();
  return p.empty_dict().tuple().reduce().setitem().stop().str();
}

TEST(TorchCheckpointPickle, RebuildFromTypeOfPlainTensorIsRead) {
  const auto refs = unpickle(rebuild_from_type("torch", "Tensor"));
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0].storage, "9");
  EXPECT_EQ(refs[0].storage_offset, 1);
  EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{3}));
}

TEST(TorchCheckpointPickle, RebuildFromTypeOfAnotherTypeIsRefused) {
  expect_error([] { unpickle(rebuild_from_type("collections", "OrderedDict")); },
               {"tensor subclass collections.OrderedDict is not supported"});
}

TEST(TorchCheckpointPickle, TiedTensorsMayBeOneMemoizedObject) {
  Pickle p;
  p.empty_dict().mark().unicode("embed");
  rebuild_tensor(p, "0").put(7).unicode("lm_head").get(7).setitems().stop();
  const auto refs = unpickle(p.str());
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].name, "embed");
  EXPECT_EQ(refs[1].name, "lm_head");
  EXPECT_EQ(refs[1].storage, "0");
}

TEST(TorchCheckpointPickle, EmptyStateDictHasNoTensors) {
  EXPECT_TRUE(unpickle(Pickle().empty_dict().stop().str()).empty());
}

TEST(TorchCheckpointPickle, OsSystemGlobalIsRefusedByName) {
  const std::string pickle =
      Pickle().global("os", "system").unicode("echo hi").op(0x85).reduce().stop().str();
  expect_error([&] { unpickle(pickle); }, {"data.pkl", "os.system", "refuses"});
}

TEST(TorchCheckpointPickle, BuiltinsEvalGlobalIsRefusedByName) {
  const std::string pickle =
      Pickle().global("builtins", "eval").unicode("1+1").op(0x85).reduce().stop().str();
  expect_error([&] { unpickle(pickle); }, {"builtins.eval", "not part of a PyTorch state dict"});
}

TEST(TorchCheckpointPickle, StackGlobalOutsideTheAllowListIsRefused) {
  const std::string pickle =
      Pickle(4).short_unicode("subprocess").short_unicode("Popen").stack_global().stop().str();
  expect_error([&] { unpickle(pickle); }, {"subprocess.Popen"});
}

TEST(TorchCheckpointPickle, AllowedGlobalWithAnotherModuleIsRefused) {
  // The allow-list is by module and name: an OrderedDict from elsewhere is not collections.OrderedDict.
  const std::string pickle = Pickle().global("evil", "OrderedDict").empty_tuple().reduce().stop().str();
  expect_error([&] { unpickle(pickle); }, {"evil.OrderedDict"});
}

TEST(TorchCheckpointPickle, ReduceOfTorchTensorIsRefused) {
  const std::string pickle = Pickle().global("torch", "Tensor").empty_tuple().reduce().stop().str();
  expect_error([&] { unpickle(pickle); }, {"calls torch.Tensor", "refused"});
}

TEST(TorchCheckpointPickle, InstOpcodeIsRefused) {
  const std::string pickle = Pickle().mark().raw("ios\nsystem\n").stop().str();
  expect_error([&] { unpickle(pickle); }, {"opcode 0x69", "at byte 3"});
}

TEST(TorchCheckpointPickle, NewobjOpcodeIsRefused) {
  const std::string pickle = Pickle().global("torch", "Tensor").empty_tuple().op(0x81).stop().str();
  expect_error([&] { unpickle(pickle); }, {"opcode 0x81"});
}

TEST(TorchCheckpointPickle, TopLevelListIsRefused) {
  expect_error([] { unpickle(Pickle().empty_list().stop().str()); },
               {"not a state dict", "a list", "not a dict of tensors"});
}

TEST(TorchCheckpointPickle, IntValueIsNotATensor) {
  const std::string pickle = Pickle().empty_dict().unicode("step").integer(3).setitem().stop().str();
  expect_error([&] { unpickle(pickle); }, {"entry 'step'", "an int", "not a tensor"});
}

TEST(TorchCheckpointPickle, NonStringKeyIsRefused) {
  Pickle p;
  p.empty_dict().integer(1);
  const std::string pickle = rebuild_tensor(p, "0").setitem().stop().str();
  expect_error([&] { unpickle(pickle); }, {"a key is an int"});
}

TEST(TorchCheckpointPickle, DuplicateKeyIsRefused) {
  expect_error([] { unpickle(plain_dict_of_tensors({"w", "v", "w"})); }, {"tensor 'w' appears twice"});
}

TEST(TorchCheckpointPickle, EveryPrefixOfAValidPickleThrows) {
  const std::string pickle = torch_pickle({contiguous("a", "0", {2, 3}), contiguous("b", "1", {5})});
  ASSERT_EQ(unpickle(pickle).size(), 2u);
  for (size_t n = 0; n < pickle.size(); ++n) EXPECT_THROW(unpickle(pickle.substr(0, n)), Error) << n;
  expect_error([&] { unpickle(pickle.substr(0, pickle.size() - 1)); }, {"truncated pickle"});
}

TEST(TorchCheckpointPickle, StackUnderflowIsRefused) {
  expect_error([] { unpickle(Pickle().op('0').stop().str()); }, {"stack underflow"});
  // REDUCE with only the callable, and SETITEM reaching below a MARK.
  expect_error([] { unpickle(Pickle().global("torch", "Tensor").reduce().stop().str()); },
               {"stack underflow"});
  expect_error([] { unpickle(Pickle().empty_dict().mark().integer(1).setitem().stop().str()); },
               {"stack underflow"});
}

TEST(TorchCheckpointPickle, BingetOfAnUnsetMemoKeyIsRefused) {
  expect_error([] { unpickle(Pickle().empty_dict().put(0).get(5).stop().str()); },
               {"memo entry 5 read before it was written"});
}

TEST(TorchCheckpointPickle, ObjectsLeftOnTheStackAreRefused) {
  expect_error([] { unpickle(Pickle().empty_dict().empty_dict().stop().str()); }, {"2 objects left"});
  expect_error([] { unpickle(Pickle().mark().empty_dict().stop().str()); }, {"objects left"});
}

TEST(TorchCheckpointPickle, SizeAndStrideOfDifferentLengthsAreRefused) {
  TensorSpec t = contiguous("w", "0", {2, 3});
  t.stride = {1};
  expect_error([&] { unpickle(torch_pickle({t})); }, {"2 sizes but 1 strides"});
}

TEST(TorchCheckpointPickle, NonIntegerSizeIsRefused) {
  Pickle p;
  p.empty_dict().unicode("w").global("torch._utils", "_rebuild_tensor_v2").mark();
  storage_pid(p, "0").integer(0).unicode("2").op(0x85).ints({1}).newfalse().empty_dict().tuple().reduce();
  expect_error([&] { unpickle(p.setitem().stop().str()); }, {"the size is a string, not an int"});
}

TEST(TorchCheckpointPickle, PersistentIdThatIsNotAStorageIsRefused) {
  Pickle p;
  p.empty_dict().unicode("w").global("torch._utils", "_rebuild_tensor_v2").mark();
  p.mark().unicode("module").global("torch", "FloatStorage").unicode("0").unicode("cpu").integer(4).tuple();
  p.binpersid().integer(0).ints({2}).ints({1}).newfalse().empty_dict().tuple().reduce().setitem().stop();
  expect_error([&] { unpickle(p.str()); }, {"persistent id that is not ('storage'"});
  // Nor is a bare string, the other thing a persistent id could be.
  expect_error([] { unpickle(Pickle().unicode("storage").binpersid().stop().str()); }, {"persistent id"});
}

TEST(TorchCheckpointPickle, StorageOfAnotherTypeIsRefused) {
  Pickle p;
  p.mark().unicode("storage").global("collections", "OrderedDict").unicode("0").unicode("cpu").integer(4);
  expect_error([&] { unpickle(p.tuple().binpersid().stop().str()); },
               {"unsupported storage type collections.OrderedDict"});
}

TEST(TorchCheckpointPickle, StorageSizeThatIsNotACountIsRefused) {
  for (const int64_t count : {int64_t{-1}, int64_t{-70000}}) {
    Pickle p;
    p.mark().unicode("storage").global("torch", "FloatStorage").unicode("0").unicode("cpu").integer(count);
    expect_error([&] { unpickle(p.tuple().binpersid().stop().str()); },
                 {"a storage size that is not a count"});
  }
  Pickle p;
  p.mark().unicode("storage").global("torch", "FloatStorage").unicode("0").unicode("cpu").unicode("4");
  expect_error([&] { unpickle(p.tuple().binpersid().stop().str()); }, {"a storage size that is not a count"});
}

TEST(TorchCheckpointPickle, TensorsOfTooManyDimensionsAreRefused) {
  const std::vector<int64_t> ones(kMaxTorchTensorDims, 1);
  EXPECT_EQ(unpickle(torch_pickle({contiguous("w", "0", ones)})).at(0).shape.size(), kMaxTorchTensorDims);
  std::vector<int64_t> more = ones;
  more.push_back(1);
  expect_error([&] { unpickle(torch_pickle({contiguous("w", "0", more)})); },
               {fmt::format("a tensor of {} dimensions", kMaxTorchTensorDims + 1)});
}

// The caps keep a small pickle from making the reader hold far more than a state dict's worth of memory.
TEST(TorchCheckpointPickle, ManyKeysNamingOneLargeTensorAreRefusedByTheDimensionCap) {
  // One 64-dimension tensor, memoized, under more keys than kMaxTorchDimsInAll / 65: each entry would copy
  // its shape and stride.
  Pickle p;
  p.empty_dict().global("torch._utils", "_rebuild_tensor_v2").mark();
  storage_pid(p, "0").integer(0);
  const std::vector<int64_t> ones(kMaxTorchTensorDims, 1);
  p.ints(ones)
      .ints(ones)
      .newfalse()
      .global("collections", "OrderedDict")
      .empty_tuple()
      .reduce()
      .tuple()
      .reduce();
  p.put(1).op('0').mark();
  const size_t keys = kMaxTorchDimsInAll / (kMaxTorchTensorDims + 1) + 1;
  for (size_t i = 0; i < keys; ++i) p.unicode(std::to_string(i)).get(1);
  p.setitems().stop();
  expect_error([&] { unpickle(p.str()); }, {"dimensions in all, far more than a model's"});
}

TEST(TorchCheckpointPickle, ManyTensorRecordsAreRefusedByTheDimensionCap) {
  // _rebuild_tensor_v2 called again and again on memoized arguments (5 bytes a call).
  Pickle p;
  p.empty_dict().global("torch._utils", "_rebuild_tensor_v2").put(1).op('0').mark();
  storage_pid(p, "0").integer(0);
  const std::vector<int64_t> ones(kMaxTorchTensorDims, 1);
  p.ints(ones).ints(ones).newfalse().global("collections", "OrderedDict").empty_tuple().reduce().tuple();
  p.put(2).op('0');
  for (size_t i = 0; i <= kMaxTorchDimsInAll / (kMaxTorchTensorDims + 1); ++i)
    p.get(1).get(2).reduce().op('0');
  p.stop();
  expect_error([&] { unpickle(p.str()); }, {"tensor records have more than", "dimensions in all"});
}

TEST(TorchCheckpointPickle, ManyObjectsAreRefusedByTheObjectCap) {
  Pickle p;
  p.empty_dict();
  for (size_t i = 0; i < kMaxTorchPickleObjects; ++i) p.integer(1).op('0');
  p.stop();
  expect_error([&] { unpickle(p.str()); }, {"builds more than", "objects"});
}

TEST(TorchCheckpointPickle, StorageKeysThatAreNotPlainRecordNamesAreRefused) {
  for (const std::string key : {"a/b", "../../etc/passwd", "..", ".", "a\\b", ""}) {
    SCOPED_TRACE(key);
    Pickle p;
    p.empty_dict().unicode("w");
    rebuild_tensor(p, key).setitem().stop();
    expect_error([&] { unpickle(p.str()); }, {"storage key that is not a plain record name"});
  }
}

TEST(TorchCheckpointPickle, SelfReferentialListNeitherCrashesNorHangs) {
  // l = []; l.append(l); l.append(l): a cycle through the memo.
  const std::string pickle = Pickle().empty_list().put(0).get(0).append().get(0).append().stop().str();
  expect_error([&] { unpickle(pickle); }, {"a list", "not a dict of tensors"});
}

TEST(TorchCheckpointPickle, SelfReferentialDictIsNotATensor) {
  // d = {}; d['w'] = d
  const std::string pickle = Pickle().empty_dict().put(0).unicode("w").get(0).setitem().stop().str();
  expect_error([&] { unpickle(pickle); }, {"entry 'w' is a dict, not a tensor"});
}

TEST(TorchCheckpointPickle, OversizedLongIsRefused) {
  const std::string pickle = Pickle().op(0x8a).byte(9).raw(std::string(9, '\1')).stop().str();
  expect_error([&] { unpickle(pickle); }, {"integer of 9 bytes"});
}

TEST(TorchCheckpointPickle, RebuildWithTheWrongArgumentCountIsRefused) {
  Pickle p;
  p.empty_dict().unicode("w").global("torch._utils", "_rebuild_tensor_v2").mark();
  storage_pid(p, "0").integer(0).tuple().reduce().setitem().stop();
  expect_error([&] { unpickle(p.str()); }, {"_rebuild_tensor_v2 with 2 arguments"});
}

// ---------------------------------------------------------------------------------------------
// TorchCheckpointFile

class TorchCheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("symprune_torch_"); }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const Checkpoint& c, const std::string& name = "pytorch_model.bin") {
    return symprune::testing::write_file(dir_ / name, checkpoint_bytes(c));
  }
  static std::string read(const TorchCheckpointFile& file, const std::string& name) {
    const TensorInfo* info = file.find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return {};
    std::vector<std::byte> out;
    file.read_bytes(*info, out);
    return as_string(out);
  }

  fs::path dir_;
};

TEST_F(TorchCheckpointFileTest, ContiguousTensorsReadBackByteExact) {
  Checkpoint c;
  const std::string w = f32({1.5f, -2.0f, 0.25f, 8.0f, -0.5f, 3.0f});
  const std::string h = u16({0x3c00, 0xc000, 0x7bff, 0x0001});
  const std::string b = u16({0x3f80, 0x4000, 0xbf80, 0x0000});
  c.tensors = {contiguous("w", "0", {2, 3}), contiguous("h", "1", {4}, "HalfStorage"),
               contiguous("b", "2", {2, 2}, "BFloat16Storage")};
  c.storages = {{"0", w}, {"1", h}, {"2", b}};
  const auto file = TorchCheckpointFile::open(write(c));
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.tensors()[0].name, "w");
  EXPECT_EQ(file.tensors()[1].name, "h");
  EXPECT_EQ(file.tensors()[2].name, "b");
  EXPECT_EQ(file.tensors()[0].dtype, DType::kF32);
  EXPECT_EQ(file.tensors()[1].dtype, DType::kF16);
  EXPECT_EQ(file.tensors()[2].dtype, DType::kBF16);
  EXPECT_EQ(file.tensors()[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(file.tensors()[0].data_end - file.tensors()[0].data_begin, 24u);
  EXPECT_EQ(read(file, "w"), w);
  EXPECT_EQ(read(file, "h"), h);
  EXPECT_EQ(read(file, "b"), b);
  EXPECT_EQ(file.find("missing"), nullptr);
}

TEST_F(TorchCheckpointFileTest, DataSpanPointsAtTheStorageRecordInTheArchive) {
  const fs::path path = write(small_checkpoint());
  const std::string archive = checkpoint_bytes(small_checkpoint());
  const auto file = TorchCheckpointFile::open(path);
  const TensorInfo& info = file.tensors().at(0);
  EXPECT_EQ(archive.substr(info.data_begin, info.data_end - info.data_begin), f32_iota(6));
}

TEST_F(TorchCheckpointFileTest, TransposedViewIsGatheredRowMajor) {
  Checkpoint c;
  // Storage: a 2x3 row-major [[0,1,2],[3,4,5]]; the view is its transpose, shape (3,2), stride (1,3).
  c.tensors = {view("t", "0", 0, {3, 2}, {1, 3})};
  c.storages = {{"0", f32_iota(6)}};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "t"), f32({0, 3, 1, 4, 2, 5}));
}

TEST_F(TorchCheckpointFileTest, ViewWithAStorageOffsetIsGathered) {
  Checkpoint c;
  c.tensors = {
      // Elements 4..7 as a 2x2 (contiguous, offset only).
      view("rows", "0", 4, {2, 2}, {2, 1}),
      // Columns 1..2 of a 3x4 matrix: offset 1, stride (4,1), gaps between rows.
      view("cols", "0", 1, {3, 2}, {4, 1}),
      // A 3-D view with a size-1 dimension of arbitrary stride (still contiguous).
      view("unit", "0", 8, {1, 2, 2}, {99, 2, 1}),
  };
  c.storages = {{"0", f32_iota(12)}};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "rows"), f32({4, 5, 6, 7}));
  EXPECT_EQ(read(file, "cols"), f32({1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(read(file, "unit"), f32({8, 9, 10, 11}));
}

TEST_F(TorchCheckpointFileTest, TensorsMayShareOneStorage) {
  Checkpoint c;
  c.tensors = {contiguous("embed", "0", {4, 2}), contiguous("lm_head", "0", {4, 2}),
               contiguous("second_half", "0", {2, 2}, "FloatStorage", 4)};
  c.storages = {{"0", f32_iota(8)}};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "embed"), f32_iota(8));
  EXPECT_EQ(read(file, "lm_head"), f32_iota(8));
  EXPECT_EQ(read(file, "second_half"), f32({4, 5, 6, 7}));
}

TEST_F(TorchCheckpointFileTest, ScalarAndEmptyTensorsAreRead) {
  Checkpoint c;
  c.tensors = {view("scalar", "0", 2, {}, {}), contiguous("empty", "0", {0, 5})};
  c.storages = {{"0", f32({7, 8, 9})}};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "scalar"), f32({9}));
  EXPECT_EQ(read(file, "empty"), "");
}

TEST_F(TorchCheckpointFileTest, Zip64ArchiveWithAnotherPrefixIsRead) {
  Checkpoint c = small_checkpoint();
  c.zip64 = true;
  c.prefix = "my_model";  // torch < 2 named the prefix after the file
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "w"), f32_iota(6));
}

TEST_F(TorchCheckpointFileTest, ViewPastItsStorageIsRefused) {
  Checkpoint c;
  c.tensors = {contiguous("w", "0", {2, 3}, "FloatStorage", 1)};  // elements 1..6 of a 6-element storage
  c.storages = {{"0", f32_iota(6)}};
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'w'", "reaches element 6 of a storage of 6", "archive/data/0", "corrupt"});
}

TEST_F(TorchCheckpointFileTest, StridedViewPastItsStorageIsRefused) {
  Checkpoint c;
  c.tensors = {view("t", "0", 1, {3, 2}, {1, 3})};  // reaches element 1 + 2 + 3 = 6
  c.storages = {{"0", f32_iota(6)}};
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 't'", "reaches element 6 of a storage of 6"});
}

TEST_F(TorchCheckpointFileTest, MissingStorageRecordIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].key = "7";
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'w'", "storage record archive/data/7 is missing"});
}

TEST_F(TorchCheckpointFileTest, NegativeStorageOffsetIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].offset = -1;
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'w'", "storage offset -1 outside its storage of 6 elements"});
}

TEST_F(TorchCheckpointFileTest, StorageOffsetPastItsStorageIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].offset = 7;
  c.tensors[0].shape = {0};
  c.tensors[0].stride = {1};
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'w'", "storage offset 7 outside its storage of 6 elements"});
}

TEST_F(TorchCheckpointFileTest, StorageRecordShorterThanThePickleSaysIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].storage_numel = 8;  // the record holds 6 floats
  expect_error(
      [&] { TorchCheckpointFile::open(write(c)); },
      {"tensor 'w'", "archive/data/0 holds 24 bytes", "the pickle says 8 elements", "truncated or corrupt"});
}

TEST_F(TorchCheckpointFileTest, StorageRecordOfPartialElementsIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].storage_numel = 6;
  c.storages["0"] += "xy";  // 26 bytes: not a whole number of floats
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"holds 26 bytes", "truncated or corrupt"});
}

TEST_F(TorchCheckpointFileTest, NegativeSizeOrStrideIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].stride = {-3, 1};
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"tensor 'w'", "negative stride in [-3, 1]"});
  c.tensors[0].stride = {3, 1};
  c.tensors[0].shape = {2, -3};
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"tensor 'w'", "negative size in [2, -3]"});
}

TEST_F(TorchCheckpointFileTest, OverflowingSizeIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'w'", "size [1099511627776, 1099511627776] overflows"});
}

// A zero extent after dimensions whose product overflows: still refused (the element count is not simply 0).
TEST_F(TorchCheckpointFileTest, OverflowingSizeBeforeAZeroExtentIsRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors = {view("e", "0", 0, {int64_t{1} << 40, int64_t{1} << 40, 0}, {0, 0, 0})};
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"tensor 'e'", "overflows"});
}

TEST_F(TorchCheckpointFileTest, EmptyViewWithHugeTrailingDimensionsReadsAsEmpty) {
  Checkpoint c = small_checkpoint();
  c.tensors = {view("e", "0", 0, {0, int64_t{1} << 40, int64_t{1} << 40}, {0, 0, 0})};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(file.tensors().at(0).numel(), 0);
  EXPECT_EQ(read(file, "e"), "");
}

// torch.save writes parameters as they are, never expanded views; a broadcast view over a few stored values
// would make a huge tensor of a small file (and its byte count can wrap).
TEST_F(TorchCheckpointFileTest, BroadcastViewsAreRefused) {
  Checkpoint c = small_checkpoint();
  c.tensors = {view("b", "0", 0, {1000, 2}, {0, 1})};
  expect_error([&] { TorchCheckpointFile::open(write(c)); },
               {"tensor 'b'", "a view of 2000 elements over a storage of 6", "broadcast"});
  c.tensors = {view("b", "0", 0, {int64_t{1} << 62}, {0})};
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"tensor 'b'", "broadcast"});
}

// A view that repeats elements but holds no more than its storage (stride 0 over a larger storage) is read.
TEST_F(TorchCheckpointFileTest, RepeatingViewWithinItsStorageIsGathered) {
  Checkpoint c = small_checkpoint();
  c.tensors = {view("r", "0", 4, {3, 2}, {0, 1})};
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "r"), f32({4, 5, 4, 5, 4, 5}));
}

TEST_F(TorchCheckpointFileTest, TensorNamesAModelCannotHaveAreRefused) {
  for (const std::string& name : {std::string(""), std::string("__metadata__"), std::string("bad\xff")}) {
    SCOPED_TRACE(name);
    Checkpoint c = small_checkpoint();
    c.tensors[0].name = name;
    expect_error([&] { TorchCheckpointFile::open(write(c)); },
                 {"a tensor named", "which a model cannot have"});
  }
}

TEST_F(TorchCheckpointFileTest, LegacyFormatIsRefused) {
  // torch < 1.6: a pickled magic number (LONG1) first, no zip archive.
  const std::string magic = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
  const std::string legacy = Pickle().op(0x8a).byte(10).raw(magic).stop().str();
  const fs::path path = symprune::testing::write_file(dir_ / "pytorch_model.bin", legacy + "more");
  expect_error([&] { TorchCheckpointFile::open(path); }, {path.string(), "legacy", "torch < 1.6"});
}

TEST_F(TorchCheckpointFileTest, BigEndianByteOrderIsRefused) {
  Checkpoint c = small_checkpoint();
  c.byteorder = "big";
  expect_error([&] { TorchCheckpointFile::open(write(c)); }, {"'big' byte order", "little-endian only"});
}

TEST_F(TorchCheckpointFileTest, MissingByteOrderRecordMeansLittleEndian) {
  Checkpoint c = small_checkpoint();
  c.byteorder.clear();
  const auto file = TorchCheckpointFile::open(write(c));
  EXPECT_EQ(read(file, "w"), f32_iota(6));
}

TEST_F(TorchCheckpointFileTest, ArchiveWithoutDataPklIsRefused) {
  const fs::path path =
      symprune::testing::write_file(dir_ / "x.bin", build_zip({{"archive/data/0", f32_iota(2)}}).bytes);
  expect_error([&] { TorchCheckpointFile::open(path); }, {"without a PREFIX/data.pkl record"});
}

TEST_F(TorchCheckpointFileTest, TwoDataPklRecordsAreRefused) {
  const std::string pickle = torch_pickle({});
  const Zip zip = build_zip({{"a/data.pkl", pickle}, {"b/data.pkl", pickle}});
  const fs::path path = symprune::testing::write_file(dir_ / "x.bin", zip.bytes);
  expect_error([&] { TorchCheckpointFile::open(path); }, {"two data.pkl records"});
}

TEST_F(TorchCheckpointFileTest, NonZipFilesAreRefused) {
  const fs::path text = symprune::testing::write_file(dir_ / "text.bin", "hello, not a checkpoint");
  expect_error([&] { TorchCheckpointFile::open(text); }, {text.string(), "not a zip archive"});
  const fs::path empty = symprune::testing::write_file(dir_ / "empty.bin", "");
  expect_error([&] { TorchCheckpointFile::open(empty); }, {empty.string(), "empty file"});
  expect_error([&] { TorchCheckpointFile::open(dir_ / "absent.bin"); }, {"absent.bin", "cannot open"});
}

TEST_F(TorchCheckpointFileTest, UnsafePickleInsideTheArchiveIsRefusedNamingTheFile) {
  Checkpoint c = small_checkpoint();
  c.pickle = Pickle().global("os", "system").unicode("true").op(0x85).reduce().stop().str();
  const fs::path path = write(c);
  expect_error([&] { TorchCheckpointFile::open(path); }, {path.string() + " (data.pkl)", "os.system"});
}

TEST_F(TorchCheckpointFileTest, MovedFileStillReads) {
  auto file = TorchCheckpointFile::open(write(small_checkpoint()));
  TorchCheckpointFile moved(std::move(file));
  EXPECT_EQ(read(moved, "w"), f32_iota(6));
}

// ---------------------------------------------------------------------------------------------
// TorchModel and open_weights_dir

class TorchCheckpointModelTest : public TorchCheckpointFileTest {
 protected:
  // pytorch_model-0000i-of-00002.bin with tensors a, b (shard 1) and c (shard 2), and their index.
  void write_two_shards(const std::string& weight_map_json) {
    Checkpoint one;
    one.tensors = {contiguous("a", "0", {2, 2}), contiguous("b", "1", {3}, "HalfStorage")};
    one.storages = {{"0", f32_iota(4)}, {"1", u16({1, 2, 3})}};
    Checkpoint two;
    two.tensors = {contiguous("c", "0", {1, 2}, "BFloat16Storage")};
    two.storages = {{"0", u16({7, 8})}};
    write(one, "pytorch_model-00001-of-00002.bin");
    write(two, "pytorch_model-00002-of-00002.bin");
    symprune::testing::write_file(
        dir_ / "pytorch_model.bin.index.json",
        R"({"metadata": {"total_size": 26}, "weight_map": )" + weight_map_json + "}");
  }
  static constexpr const char* kWeightMap =
      R"({"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00001-of-00002.bin",
          "c": "pytorch_model-00002-of-00002.bin"})";
};

TEST_F(TorchCheckpointModelTest, SingleFileModel) {
  Checkpoint c;
  c.tensors = {contiguous("z.weight", "0", {2, 3}), contiguous("a.bias", "1", {3}, "HalfStorage")};
  c.storages = {{"0", f32_iota(6)}, {"1", u16({1, 2, 3})}};
  write(c);
  const auto model = TorchModel::open_dir(dir_);
  EXPECT_FALSE(model->indexed());
  EXPECT_THAT(model->names(), ElementsAre("a.bias", "z.weight"));
  EXPECT_TRUE(model->contains("z.weight"));
  EXPECT_FALSE(model->contains("w"));
  EXPECT_EQ(model->info("z.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(model->info("a.bias").dtype, DType::kF16);
  EXPECT_EQ(model->location("a.bias"), (dir_ / "pytorch_model.bin").string());
  EXPECT_EQ(model->description(), (dir_ / "pytorch_model.bin").string());
  std::vector<std::byte> out;
  model->read_bytes("a.bias", out);
  EXPECT_EQ(as_string(out), u16({1, 2, 3}));
  const auto shards = model->shards();
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards[0].file, "model.safetensors");
  EXPECT_THAT(shards[0].tensors, ElementsAre("z.weight", "a.bias"));  // the file's order
  EXPECT_EQ(shards[0].metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_THAT(model->input_weight_files(), ElementsAre("pytorch_model.bin"));
  expect_error([&] { model->info("nope"); }, {"missing tensor 'nope'"});
}

TEST_F(TorchCheckpointModelTest, LoadF32ConvertsTheGatheredBytes) {
  Checkpoint c;
  c.tensors = {view("t", "0", 0, {3, 2}, {1, 3})};
  c.storages = {{"0", f32_iota(6)}};
  write(c);
  const Tensor t = TorchModel::open_dir(dir_)->load_f32("t");
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{3, 2}));
  const std::vector<float> expected = {0, 3, 1, 4, 2, 5};
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], expected[static_cast<size_t>(i)]) << i;
}

TEST_F(TorchCheckpointModelTest, ShardedModelWithIndex) {
  write_two_shards(kWeightMap);
  const auto model = TorchModel::open_dir(dir_);
  EXPECT_TRUE(model->indexed());
  EXPECT_THAT(model->names(), ElementsAre("a", "b", "c"));
  EXPECT_EQ(model->info("b").dtype, DType::kF16);
  EXPECT_EQ(model->info("c").dtype, DType::kBF16);
  EXPECT_EQ(model->info("c").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(model->location("c"), (dir_ / "pytorch_model-00002-of-00002.bin").string());
  EXPECT_EQ(model->description(), (dir_ / "pytorch_model.bin.index.json").string());
  std::vector<std::byte> out;
  model->read_bytes("c", out);
  EXPECT_EQ(as_string(out), u16({7, 8}));
  const auto shards = model->shards();
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].file, "model-00001-of-00002.safetensors");
  EXPECT_THAT(shards[0].tensors, ElementsAre("a", "b"));
  EXPECT_EQ(shards[0].metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(shards[1].file, "model-00002-of-00002.safetensors");
  EXPECT_THAT(shards[1].tensors, ElementsAre("c"));
  EXPECT_THAT(model->input_weight_files(),
              UnorderedElementsAre("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                                   "pytorch_model.bin.index.json"));
}

TEST_F(TorchCheckpointModelTest, WeightMapNamingAMissingShardIsRefused) {
  write_two_shards(R"({"a": "pytorch_model-00001-of-00002.bin", "c": "pytorch_model-00009-of-00009.bin"})");
  expect_error([&] { TorchModel::open_dir(dir_); }, {"pytorch_model-00009-of-00009.bin", "does not exist"});
}

TEST_F(TorchCheckpointModelTest, TensorMissingFromItsShardIsRefused) {
  write_two_shards(R"({"a": "pytorch_model-00001-of-00002.bin", "c": "pytorch_model-00001-of-00002.bin"})");
  expect_error(
      [&] { TorchModel::open_dir(dir_); },
      {"missing tensor 'c' in shard pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json"});
}

TEST_F(TorchCheckpointModelTest, ShardNameLeavingTheDirectoryIsRefused) {
  write_two_shards(R"({"a": "../pytorch_model-00001-of-00002.bin"})");
  expect_error([&] { TorchModel::open_dir(dir_); }, {"'../pytorch_model-00001-of-00002.bin'", "'..'"});
}

TEST_F(TorchCheckpointModelTest, TensorInTwoShardsIsRefused) {
  Checkpoint dup;
  dup.tensors = {contiguous("a", "0", {1})};
  dup.storages = {{"0", f32({1})}};
  write_two_shards(R"({"a": "pytorch_model-00001-of-00002.bin", "x": "extra.bin"})");
  dup.tensors.push_back(contiguous("x", "0", {1}));
  write(dup, "extra.bin");
  expect_error([&] { TorchModel::open_dir(dir_); }, {"tensor 'a' is stored in two shards"});
}

TEST_F(TorchCheckpointModelTest, ShardsThatWouldShareASafetensorsNameAreRefused) {
  write_two_shards(R"({"a": "pytorch_model-00001-of-00002.bin", "c": "model-00001-of-00002.bin"})");
  fs::copy_file(dir_ / "pytorch_model-00002-of-00002.bin", dir_ / "model-00001-of-00002.bin");
  expect_error([&] { TorchModel::open_dir(dir_); },
               {"two shards would both be written as model-00001-of-00002.safetensors"});
}

TEST_F(TorchCheckpointModelTest, ShardThatWouldBecomeModelSafetensorsIsRefused) {
  write_two_shards(R"({"a": "pytorch_model-00001-of-00002.bin", "c": "model.bin"})");
  fs::copy_file(dir_ / "pytorch_model-00002-of-00002.bin", dir_ / "model.bin");
  expect_error([&] { TorchModel::open_dir(dir_); },
               {"shard model.bin would be written as model.safetensors"});
}

TEST_F(TorchCheckpointModelTest, OpenWeightsDirPrefersSafetensors) {
  write(small_checkpoint());
  const std::string bytes = f32({1, 2});
  write_safetensors(dir_ / "model.safetensors", {{"st.only", DType::kF32, {2}, as_bytes(bytes)}}, {});
  EXPECT_FALSE(has_torch_checkpoint(dir_));
  const auto source = open_weights_dir(dir_);
  EXPECT_EQ(dynamic_cast<TorchModel*>(source.get()), nullptr);
  EXPECT_TRUE(source->contains("st.only"));
  EXPECT_FALSE(source->contains("w"));
}

TEST_F(TorchCheckpointModelTest, OpenWeightsDirFallsBackToThePytorchCheckpoint) {
  write(small_checkpoint());
  EXPECT_TRUE(has_torch_checkpoint(dir_));
  const auto source = open_weights_dir(dir_);
  EXPECT_NE(dynamic_cast<TorchModel*>(source.get()), nullptr);
  EXPECT_THAT(source->names(), ElementsAre("w"));
}

TEST_F(TorchCheckpointModelTest, OpenWeightsDirOnAnEmptyDirectoryThrows) {
  EXPECT_FALSE(has_torch_checkpoint(dir_));
  EXPECT_THROW(open_weights_dir(dir_), Error);
}

}  // namespace
}  // namespace symprune::io
