#include "io/torch_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "io/json_util.h"
#include "io/sharded_index.h"
#include "io/text_file.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// Zip

uint64_t load_le(const std::byte* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(p[i]);
  return value;
}

// Bounds-checked little-endian reads of an archive, each failure naming the file and what was read.
class ArchiveReader {
 public:
  ArchiveReader(std::span<const std::byte> archive, const std::string& where) : a_(archive), where_(where) {}
  uint64_t size() const { return a_.size(); }
  void need(uint64_t offset, uint64_t bytes, const char* what) const {
    SYMPRUNE_CHECK(offset <= a_.size() && bytes <= a_.size() - offset,
                   "{}: corrupt zip archive: {} at byte {} runs past the end of the {}-byte file", where_,
                   what, offset, a_.size());
  }
  uint64_t u(uint64_t offset, int bytes, const char* what) const {
    need(offset, static_cast<uint64_t>(bytes), what);
    return load_le(a_.data() + offset, bytes);
  }
  std::string text(uint64_t offset, uint64_t bytes, const char* what) const {
    need(offset, bytes, what);
    return std::string(reinterpret_cast<const char*>(a_.data() + offset), static_cast<size_t>(bytes));
  }
  const std::string& where() const { return where_; }

 private:
  std::span<const std::byte> a_;
  const std::string& where_;
};

constexpr uint32_t kEndOfDirectory = 0x06054b50, kZip64EndOfDirectory = 0x06064b50,
                   kZip64Locator = 0x07064b50, kDirectoryEntry = 0x02014b50, kLocalHeader = 0x04034b50;

// Offset of the end-of-central-directory record: the last signature that leaves exactly its comment after it.
uint64_t find_end_of_directory(const ArchiveReader& r) {
  SYMPRUNE_CHECK(r.size() >= 22, "{}: not a zip archive ({} bytes, shorter than its end record)", r.where(),
                 r.size());
  const uint64_t lowest = r.size() >= 22 + 0xffff ? r.size() - 22 - 0xffff : 0;
  for (uint64_t at = r.size() - 22;; --at) {
    if (r.u(at, 4, "end record") == kEndOfDirectory &&
        at + 22 + r.u(at + 20, 2, "comment length") == r.size())
      return at;
    if (at == lowest) break;
  }
  fail(
      "{}: not a complete zip archive (no end-of-central-directory record): truncated, or not a PyTorch "
      "checkpoint",
      r.where());
}

// Sizes and the local-header offset of a central-directory entry, widened from its ZIP64 extra field where
// the 32-bit fields hold 0xffffffff.
void widen_from_zip64_extra(const ArchiveReader& r, uint64_t extra, uint64_t extra_length, uint64_t& size,
                            uint64_t& compressed, uint64_t& local) {
  uint64_t at = extra;
  while (at + 4 <= extra + extra_length) {
    const uint64_t id = r.u(at, 2, "extra field id"), length = r.u(at + 2, 2, "extra field length");
    SYMPRUNE_CHECK(at + 4 + length <= extra + extra_length,
                   "{}: corrupt zip archive: extra field overruns its entry", r.where());
    if (id == 1) {
      uint64_t field = at + 4;
      const auto take = [&](uint64_t& value) {
        if (value != 0xffffffffu) return;
        SYMPRUNE_CHECK(field + 8 <= at + 4 + length, "{}: corrupt zip archive: short ZIP64 extra field",
                       r.where());
        value = r.u(field, 8, "ZIP64 extra field");
        field += 8;
      };
      take(size);
      take(compressed);
      take(local);
      return;
    }
    at += 4 + length;
  }
}

// ---------------------------------------------------------------------------------------------
// Pickle

// The element type of a storage class torch.save names (torch.FloatStorage, ...); none for other names.
std::optional<DType> storage_dtype(std::string_view module, std::string_view name) {
  static const std::map<std::string_view, DType> kTypes = {
      {"FloatStorage", DType::kF32},  {"HalfStorage", DType::kF16}, {"BFloat16Storage", DType::kBF16},
      {"DoubleStorage", DType::kF64}, {"LongStorage", DType::kI64}, {"IntStorage", DType::kI32},
      {"ShortStorage", DType::kI16},  {"CharStorage", DType::kI8},  {"ByteStorage", DType::kU8},
      {"BoolStorage", DType::kBool}};
  const auto it = kTypes.find(name);
  if (module != "torch" || it == kTypes.end()) return std::nullopt;
  return it->second;
}

// The globals a state dict's pickle may name; nothing else is accepted.
bool is_allowed_global(std::string_view module, std::string_view name) {
  // Any storage type is a plain name (load_storage says which ones are read); none is ever called.
  if (module == "torch" && name.ends_with("Storage")) return true;
  return (module == "collections" && name == "OrderedDict") ||
         (module == "torch._utils" && (name == "_rebuild_tensor_v2" || name == "_rebuild_parameter" ||
                                       name == "_rebuild_parameter_with_state")) ||
         (module == "torch._tensor" && name == "_rebuild_from_type_v2") ||
         (module == "torch" && name == "Tensor") || (module == "torch.nn.parameter" && name == "Parameter");
}

// The objects a state dict's pickle builds. Objects live in one arena and refer to each other by index, so
// a pickle that makes a container hold itself builds no reference cycle.
struct Object {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor };
  Kind kind = Kind::kNone;
  int64_t integer = 0;
  std::string text;           // string; global: module; storage: key
  std::string name;           // global: name
  DType dtype = DType::kF32;  // storage
  std::vector<size_t> items;  // tuple, list; dict: key, value, key, value, ...
  size_t tensor = 0;          // tensor: index into the interpreter's tensor records
};

Object make_object(Object::Kind kind) {
  Object object;
  object.kind = kind;
  return object;
}

const char* kind_name(Object::Kind kind) {
  switch (kind) {
    case Object::Kind::kNone:
      return "None";
    case Object::Kind::kBool:
      return "a bool";
    case Object::Kind::kInt:
      return "an int";
    case Object::Kind::kFloat:
      return "a float";
    case Object::Kind::kString:
      return "a string";
    case Object::Kind::kTuple:
      return "a tuple";
    case Object::Kind::kList:
      return "a list";
    case Object::Kind::kDict:
      return "a dict";
    case Object::Kind::kGlobal:
      return "a global";
    case Object::Kind::kStorage:
      return "a storage";
    case Object::Kind::kTensor:
      return "a tensor";
  }
  return "?";
}

class Unpickler {
 public:
  Unpickler(std::span<const std::byte> pickle, const std::string& where) : p_(pickle), where_(where) {}

  std::vector<TorchTensorRef> run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') break;
      step(op, at);
    }
    SYMPRUNE_CHECK(stack_.size() == 1 && marks_.empty(), "{}: malformed pickle: {} objects left at its end",
                   where_, stack_.size());
    const Object& top = heap_[stack_.back()];
    SYMPRUNE_CHECK(top.kind == Object::Kind::kDict,
                   "{}: not a state dict: the pickle holds {}, not a dict of tensors", where_,
                   kind_name(top.kind));
    std::vector<TorchTensorRef> out;
    std::set<std::string> seen;
    // Entries may share one tensor record (tied weights); each gets its own copy, so their dimensions count
    // against the object cap too: a pickle naming one 64-dimension tensor under millions of keys stops here.
    size_t dims = 0;
    for (size_t i = 0; i < top.items.size(); i += 2) {
      const Object& key = heap_[top.items[i]];
      const Object& value = heap_[top.items[i + 1]];
      SYMPRUNE_CHECK(key.kind == Object::Kind::kString, "{}: not a state dict: a key is {}, not a string",
                     where_, kind_name(key.kind));
      SYMPRUNE_CHECK(value.kind == Object::Kind::kTensor,
                     "{}: not a state dict: entry '{}' is {}, not a tensor (a training checkpoint? save "
                     "model.state_dict() instead)",
                     where_, key.text, kind_name(value.kind));
      SYMPRUNE_CHECK(seen.insert(key.text).second, "{}: tensor '{}' appears twice in the state dict", where_,
                     key.text);
      dims += 1 + tensors_[value.tensor].shape.size();
      SYMPRUNE_CHECK(
          dims <= kMaxTorchDimsInAll,
          "{}: the state dict's tensors have more than {} dimensions in all, far more than a model's; "
          "refused",
          where_, kMaxTorchDimsInAll);
      out.push_back(tensors_[value.tensor]);
      out.back().name = key.text;
    }
    return out;
  }

 private:
  std::span<const std::byte> take(size_t bytes) {
    SYMPRUNE_CHECK(bytes <= p_.size() - pos_, "{}: truncated pickle: {} more bytes needed at byte {} of {}",
                   where_, bytes, pos_, p_.size());
    const auto out = p_.subspan(pos_, bytes);
    pos_ += bytes;
    return out;
  }
  uint64_t take_le(int bytes) { return load_le(take(static_cast<size_t>(bytes)).data(), bytes); }
  std::string take_text(uint64_t bytes) {
    SYMPRUNE_CHECK(bytes <= p_.size() - pos_, "{}: truncated pickle: a {}-byte string at byte {} of {}",
                   where_, bytes, pos_, p_.size());
    const auto span = take(static_cast<size_t>(bytes));
    return std::string(reinterpret_cast<const char*>(span.data()), span.size());
  }
  std::string take_line() {
    std::string out;
    while (true) {
      const char c = static_cast<char>(take(1)[0]);
      if (c == '\n') return out;
      out += c;
    }
  }

  size_t make(Object object) {
    SYMPRUNE_CHECK(heap_.size() < kMaxTorchPickleObjects,
                   "{}: the pickle builds more than {} objects, far more than a state dict needs; refused",
                   where_, kMaxTorchPickleObjects);
    heap_.push_back(std::move(object));
    return heap_.size() - 1;
  }
  void push(Object object) { stack_.push_back(make(std::move(object))); }
  size_t pop() {
    SYMPRUNE_CHECK(stack_.size() > (marks_.empty() ? 0 : marks_.back()),
                   "{}: malformed pickle: stack underflow at byte {}", where_, pos_);
    const size_t out = stack_.back();
    stack_.pop_back();
    return out;
  }
  size_t& top() {
    SYMPRUNE_CHECK(stack_.size() > (marks_.empty() ? 0 : marks_.back()),
                   "{}: malformed pickle: stack underflow at byte {}", where_, pos_);
    return stack_.back();
  }
  std::vector<size_t> pop_to_mark() {
    SYMPRUNE_CHECK(!marks_.empty(), "{}: malformed pickle: no mark at byte {}", where_, pos_);
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<size_t> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  Object& container(size_t index, Object::Kind kind, const char* op) {
    Object& object = heap_[index];
    SYMPRUNE_CHECK(object.kind == kind, "{}: malformed pickle: {} on {} at byte {}", where_, op,
                   kind_name(object.kind), pos_);
    return object;
  }
  void memo_put(uint64_t key) { memo_[key] = top(); }
  void memo_get(uint64_t key) {
    const auto it = memo_.find(key);
    SYMPRUNE_CHECK(it != memo_.end(), "{}: malformed pickle: memo entry {} read before it was written",
                   where_, key);
    stack_.push_back(it->second);
  }
  void push_tuple(std::vector<size_t> items) {
    Object tuple = make_object(Object::Kind::kTuple);
    tuple.items = std::move(items);
    push(std::move(tuple));
  }
  void push_global(std::string module, std::string name) {
    SYMPRUNE_CHECK(
        is_allowed_global(module, name),
        "{}: the pickle names {}.{}, which is not part of a PyTorch state dict; symprune runs no code "
        "from a checkpoint and refuses it",
        where_, module, name);
    Object global = make_object(Object::Kind::kGlobal);
    global.text = std::move(module);
    global.name = std::move(name);
    push(std::move(global));
  }

  int64_t integer(size_t index, const char* what) const {
    const Object& o = heap_[index];
    SYMPRUNE_CHECK(o.kind == Object::Kind::kInt, "{}: malformed tensor record: {} is {}, not an int", where_,
                   what, kind_name(o.kind));
    return o.integer;
  }
  std::vector<int64_t> integers(size_t index, const char* what) const {
    const Object& o = heap_[index];
    SYMPRUNE_CHECK(o.kind == Object::Kind::kTuple, "{}: malformed tensor record: {} is {}, not a tuple",
                   where_, what, kind_name(o.kind));
    std::vector<int64_t> out;
    for (size_t item : o.items) out.push_back(integer(item, what));
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]).
  Object rebuild_tensor(const std::vector<size_t>& args) {
    SYMPRUNE_CHECK(args.size() == 6 || args.size() == 7,
                   "{}: malformed tensor record: _rebuild_tensor_v2 with {} arguments", where_, args.size());
    const Object& storage = heap_[args[0]];
    SYMPRUNE_CHECK(storage.kind == Object::Kind::kStorage, "{}: malformed tensor record: its storage is {}",
                   where_, kind_name(storage.kind));
    TorchTensorRef record;
    record.storage = storage.text;
    record.dtype = storage.dtype;
    record.storage_numel = storage.integer;
    record.storage_offset = integer(args[1], "the storage offset");
    SYMPRUNE_CHECK(
        heap_[args[2]].kind != Object::Kind::kTuple || heap_[args[2]].items.size() <= kMaxTorchTensorDims,
        "{}: a tensor of {} dimensions (at most {} are read)", where_, heap_[args[2]].items.size(),
        kMaxTorchTensorDims);
    record.shape = integers(args[2], "the size");
    record.stride = integers(args[3], "the stride");
    SYMPRUNE_CHECK(record.shape.size() == record.stride.size(),
                   "{}: malformed tensor record: {} sizes but {} strides", where_, record.shape.size(),
                   record.stride.size());
    record_dims_ += 1 + record.shape.size();
    SYMPRUNE_CHECK(
        record_dims_ <= kMaxTorchDimsInAll,
        "{}: the pickle's tensor records have more than {} dimensions in all, far more than a model's; "
        "refused",
        where_, kMaxTorchDimsInAll);
    Object tensor = make_object(Object::Kind::kTensor);
    tensor.tensor = tensors_.size();
    tensors_.push_back(std::move(record));
    return tensor;
  }

  Object call(const Object& callable, const Object& args_tuple) {
    SYMPRUNE_CHECK(callable.kind == Object::Kind::kGlobal && args_tuple.kind == Object::Kind::kTuple,
                   "{}: malformed pickle: REDUCE of {} with {}", where_, kind_name(callable.kind),
                   kind_name(args_tuple.kind));
    const std::vector<size_t>& args = args_tuple.items;
    const std::string what = callable.text + "." + callable.name;
    if (what == "collections.OrderedDict") {
      SYMPRUNE_CHECK(args.empty(), "{}: malformed pickle: OrderedDict with arguments", where_);
      return make_object(Object::Kind::kDict);
    }
    if (what == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(args);
    if (what == "torch._utils._rebuild_parameter" || what == "torch._utils._rebuild_parameter_with_state") {
      SYMPRUNE_CHECK(!args.empty() && heap_[args[0]].kind == Object::Kind::kTensor,
                     "{}: malformed tensor record: {} without a tensor", where_, what);
      return heap_[args[0]];
    }
    if (what == "torch._tensor._rebuild_from_type_v2") {
      // (func, type, args, state): a plain tensor or parameter rebuilt by func.
      SYMPRUNE_CHECK(args.size() == 4 && heap_[args[0]].kind == Object::Kind::kGlobal &&
                         heap_[args[1]].kind == Object::Kind::kGlobal,
                     "{}: malformed tensor record: _rebuild_from_type_v2 arguments", where_);
      const Object& func = heap_[args[0]];
      const Object& type = heap_[args[1]];
      SYMPRUNE_CHECK(type.name == "Tensor" || type.name == "Parameter",
                     "{}: tensor subclass {}.{} is not supported", where_, type.text, type.name);
      SYMPRUNE_CHECK(func.name == "_rebuild_tensor_v2" && heap_[args[2]].kind == Object::Kind::kTuple,
                     "{}: malformed tensor record: _rebuild_from_type_v2 of {}.{}", where_, func.text,
                     func.name);
      return rebuild_tensor(heap_[args[2]].items);
    }
    fail("{}: the pickle calls {}, which a state dict does not; refused", where_, what);
  }

  // A persistent id: ('storage', torch.<Type>Storage, key, location, numel).
  Object load_storage(const Object& pid) {
    SYMPRUNE_CHECK(
        pid.kind == Object::Kind::kTuple && pid.items.size() == 5 &&
            heap_[pid.items[0]].kind == Object::Kind::kString && heap_[pid.items[0]].text == "storage",
        "{}: malformed pickle: a persistent id that is not ('storage', type, key, location, size)", where_);
    const Object& type = heap_[pid.items[1]];
    const Object& key = heap_[pid.items[2]];
    SYMPRUNE_CHECK(
        type.kind == Object::Kind::kGlobal && storage_dtype(type.text, type.name).has_value(),
        "{}: unsupported storage type {}{}{} (supported: Float, Half, BFloat16, Double, Long, Int, Short, "
        "Char, Byte and Bool storages)",
        where_, type.text, type.kind == Object::Kind::kGlobal ? "." : "", type.name);
    SYMPRUNE_CHECK(key.kind == Object::Kind::kString && !key.text.empty() &&
                       key.text.find_first_of("/\\") == std::string::npos && key.text != "." &&
                       key.text != "..",
                   "{}: malformed pickle: a storage key that is not a plain record name", where_);
    const Object& numel = heap_[pid.items[4]];
    SYMPRUNE_CHECK(numel.kind == Object::Kind::kInt && numel.integer >= 0,
                   "{}: malformed pickle: a storage size that is not a count", where_);
    Object storage = make_object(Object::Kind::kStorage);
    storage.text = key.text;
    storage.dtype = *storage_dtype(type.text, type.name);
    storage.integer = numel.integer;
    return storage;
  }

  void step(unsigned char op, size_t at) {
    switch (op) {
      case 0x80:
        take(1);
        return;  // PROTO
      case 0x95:
        take(8);
        return;  // FRAME
      case '(':
        marks_.push_back(stack_.size());
        return;
      case '0':
        pop();
        return;
      case '1':
        pop_to_mark();
        return;
      case 'N':
        push(make_object(Object::Kind::kNone));
        return;
      case 0x88:
      case 0x89: {
        Object b = make_object(Object::Kind::kBool);
        b.integer = op == 0x88;
        push(std::move(b));
        return;
      }
      case 'J': {
        Object i = make_object(Object::Kind::kInt);
        i.integer = static_cast<int32_t>(static_cast<uint32_t>(take_le(4)));
        push(std::move(i));
        return;
      }
      case 'K':
      case 'M': {
        Object i = make_object(Object::Kind::kInt);
        i.integer = static_cast<int64_t>(take_le(op == 'K' ? 1 : 2));
        push(std::move(i));
        return;
      }
      case 0x8a: {  // LONG1
        const auto n = static_cast<int>(take_le(1));
        SYMPRUNE_CHECK(n <= 8, "{}: an integer of {} bytes in the pickle (at most 8 are read)", where_, n);
        uint64_t v = n > 0 ? take_le(n) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        Object i = make_object(Object::Kind::kInt);
        i.integer = static_cast<int64_t>(v);
        push(std::move(i));
        return;
      }
      case 'G': {  // BINFLOAT, big-endian
        uint64_t bits = 0;
        for (std::byte b : take(8)) bits = (bits << 8) | static_cast<uint64_t>(b);
        Object f = make_object(Object::Kind::kFloat);
        f.integer = static_cast<int64_t>(bits);
        push(std::move(f));
        return;
      }
      case 'X':
      case 0x8c:
      case 0x8d:
      case 'U':
      case 'T': {
        const int width = op == 0x8c || op == 'U' ? 1 : op == 0x8d ? 8 : 4;
        Object s = make_object(Object::Kind::kString);
        s.text = take_text(take_le(width));
        push(std::move(s));
        return;
      }
      case '}':
        push(make_object(Object::Kind::kDict));
        return;
      case ']':
        push(make_object(Object::Kind::kList));
        return;
      case ')':
        push_tuple({});
        return;
      case 't':
        push_tuple(pop_to_mark());
        return;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<size_t> items(static_cast<size_t>(op - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push_tuple(std::move(items));
        return;
      }
      case 'l': {
        Object list = make_object(Object::Kind::kList);
        list.items = pop_to_mark();
        push(std::move(list));
        return;
      }
      case 'd': {
        Object dict = make_object(Object::Kind::kDict);
        dict.items = pop_to_mark();
        SYMPRUNE_CHECK(dict.items.size() % 2 == 0, "{}: malformed pickle: DICT of an odd count", where_);
        push(std::move(dict));
        return;
      }
      case 'q':
        memo_put(take_le(1));
        return;
      case 'r':
        memo_put(take_le(4));
        return;
      case 0x94:
        memo_put(memo_.size());
        return;  // MEMOIZE
      case 'h':
        memo_get(take_le(1));
        return;
      case 'j':
        memo_get(take_le(4));
        return;
      case 'c': {
        std::string module = take_line();
        std::string name = take_line();
        push_global(std::move(module), std::move(name));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const Object& name = heap_[pop()];
        const Object& module = heap_[pop()];
        SYMPRUNE_CHECK(name.kind == Object::Kind::kString && module.kind == Object::Kind::kString,
                       "{}: malformed pickle: STACK_GLOBAL of non-strings", where_);
        push_global(module.text, name.text);
        return;
      }
      case 'Q': {  // BINPERSID
        const size_t pid = pop();
        push(load_storage(heap_[pid]));
        return;
      }
      case 'R': {
        const size_t args = pop();
        const size_t callable = pop();
        push(call(heap_[callable], heap_[args]));
        return;
      }
      case 'b': {  // BUILD: a state dict's _metadata, a parameter's state: nothing the weights need
        pop();
        const Object& object = heap_[top()];
        SYMPRUNE_CHECK(object.kind == Object::Kind::kDict || object.kind == Object::Kind::kTensor,
                       "{}: malformed pickle: BUILD on {}", where_, kind_name(object.kind));
        return;
      }
      case 's': {
        const size_t value = pop();
        const size_t key = pop();
        Object& dict = container(top(), Object::Kind::kDict, "SETITEM");
        dict.items.push_back(key);
        dict.items.push_back(value);
        return;
      }
      case 'u': {
        const std::vector<size_t> items = pop_to_mark();
        SYMPRUNE_CHECK(items.size() % 2 == 0, "{}: malformed pickle: SETITEMS of an odd count", where_);
        Object& dict = container(top(), Object::Kind::kDict, "SETITEMS");
        dict.items.insert(dict.items.end(), items.begin(), items.end());
        return;
      }
      case 'a': {
        const size_t value = pop();
        container(top(), Object::Kind::kList, "APPEND").items.push_back(value);
        return;
      }
      case 'e': {
        const std::vector<size_t> items = pop_to_mark();
        Object& list = container(top(), Object::Kind::kList, "APPENDS");
        list.items.insert(list.items.end(), items.begin(), items.end());
        return;
      }
      default:
        fail("{}: the pickle uses opcode 0x{:02x} at byte {}, which a PyTorch state dict does not; refused",
             where_, op, at);
    }
  }

  std::span<const std::byte> p_;
  const std::string& where_;
  size_t pos_ = 0;
  std::vector<Object> heap_;
  std::vector<TorchTensorRef> tensors_;  // one per _rebuild_tensor_v2 call
  size_t record_dims_ = 0;               // their dimensions plus one each
  std::vector<size_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, size_t> memo_;
};

std::string reconvert_hint() {
  return "re-save it with a current PyTorch (torch.save(torch.load(FILE, weights_only=True), FILE)) or "
         "convert "
         "it to safetensors";
}

// model.safetensors for pytorch_model.bin; model-00001-of-00002.safetensors for
// pytorch_model-00001-of-00002.bin.
std::string safetensors_name_for(const std::string& torch_name) {
  fs::path path(torch_name);
  std::string stem = path.stem().string();
  if (stem.starts_with("pytorch_")) stem = stem.substr(8);
  path.replace_filename(stem + ".safetensors");
  return path.generic_string();
}

// A name the safetensors output can hold: non-empty UTF-8, not its reserved key.
void check_tensor_name(const std::string& name, const std::string& where) {
  SYMPRUNE_CHECK(!name.empty() && name != "__metadata__" && is_valid_utf8(name),
                 "{}: the state dict has a tensor named {}, which a model cannot have", where,
                 name.empty()          ? std::string("''")
                 : is_valid_utf8(name) ? "'" + name + "'"
                                       : "with invalid UTF-8");
}

}  // namespace

bool starts_like_pickle(std::span<const std::byte> head) {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 &&
         static_cast<unsigned char>(head[1]) >= 2 && static_cast<unsigned char>(head[1]) <= 5;
}

// ---------------------------------------------------------------------------------------------
// Zip records

std::vector<ZipRecord> read_zip_records(std::span<const std::byte> archive, const std::string& where) {
  const ArchiveReader r(archive, where);
  const uint64_t end = find_end_of_directory(r);
  uint64_t entries = r.u(end + 10, 2, "entry count");
  uint64_t directory_size = r.u(end + 12, 4, "directory size");
  uint64_t directory = r.u(end + 16, 4, "directory offset");
  if (entries == 0xffff || directory_size == 0xffffffffu || directory == 0xffffffffu) {
    SYMPRUNE_CHECK(end >= 20 && r.u(end - 20, 4, "ZIP64 locator") == kZip64Locator,
                   "{}: corrupt zip archive: ZIP64 sizes without a ZIP64 locator", where);
    const uint64_t record = r.u(end - 20 + 8, 8, "ZIP64 end record offset");
    SYMPRUNE_CHECK(r.u(record, 4, "ZIP64 end record") == kZip64EndOfDirectory,
                   "{}: corrupt zip archive: no ZIP64 end record at byte {}", where, record);
    entries = r.u(record + 32, 8, "entry count");
    directory_size = r.u(record + 40, 8, "directory size");
    directory = r.u(record + 48, 8, "directory offset");
  }
  r.need(directory, directory_size, "central directory");
  SYMPRUNE_CHECK(entries <= directory_size / 46, "{}: corrupt zip archive: {} entries in a {}-byte directory",
                 where, entries, directory_size);
  std::vector<ZipRecord> out;
  std::set<std::string> names;
  uint64_t at = directory;
  for (uint64_t i = 0; i < entries; ++i) {
    SYMPRUNE_CHECK(r.u(at, 4, "directory entry") == kDirectoryEntry,
                   "{}: corrupt zip archive: directory entry {} has no signature", where, i);
    const uint64_t method = r.u(at + 10, 2, "compression method");
    uint64_t compressed = r.u(at + 20, 4, "compressed size"), size = r.u(at + 24, 4, "size");
    const uint64_t name_length = r.u(at + 28, 2, "name length"),
                   extra_length = r.u(at + 30, 2, "extra length"),
                   comment_length = r.u(at + 32, 2, "comment length");
    uint64_t local = r.u(at + 42, 4, "local header offset");
    ZipRecord record;
    record.name = r.text(at + 46, name_length, "record name");
    widen_from_zip64_extra(r, at + 46 + name_length, extra_length, size, compressed, local);
    SYMPRUNE_CHECK(
        method == 0 && compressed == size,
        "{}: record '{}' is compressed (method {}); PyTorch writes its records stored, so the file was "
        "re-zipped: {}",
        where, record.name, method, reconvert_hint());
    SYMPRUNE_CHECK(r.u(local, 4, "local header") == kLocalHeader,
                   "{}: corrupt zip archive: record '{}' has no local header at byte {}", where, record.name,
                   local);
    record.offset =
        local + 30 + r.u(local + 26, 2, "local name length") + r.u(local + 28, 2, "local extra length");
    record.size = size;
    r.need(record.offset, record.size, "record data");
    SYMPRUNE_CHECK(names.insert(record.name).second, "{}: corrupt zip archive: record '{}' appears twice",
                   where, record.name);
    out.push_back(std::move(record));
    at += 46 + name_length + extra_length + comment_length;
  }
  return out;
}

std::vector<TorchTensorRef> unpickle_state_dict(std::span<const std::byte> pickle, const std::string& where) {
  return Unpickler(pickle, where).run();
}

// ---------------------------------------------------------------------------------------------
// TorchCheckpointFile

TorchCheckpointFile::TorchCheckpointFile(TorchCheckpointFile&&) noexcept = default;
TorchCheckpointFile& TorchCheckpointFile::operator=(TorchCheckpointFile&&) noexcept = default;
TorchCheckpointFile::~TorchCheckpointFile() = default;

TorchCheckpointFile TorchCheckpointFile::open(const fs::path& path) {
  const std::string where = path.string();
  TorchCheckpointFile file;
  file.path_ = path;
  file.map_ = MappedFile::open(path);
  SYMPRUNE_CHECK(file.map_.size() > 0, "{}: empty file", where);
  const std::span<const std::byte> archive = file.map_.bytes();

  SYMPRUNE_CHECK(
      !starts_like_pickle(archive),
      "{}: a PyTorch checkpoint in the legacy format of torch < 1.6, which symprune does not read: {}", where,
      reconvert_hint());
  SYMPRUNE_CHECK(archive.size() >= 4 && load_le(archive.data(), 4) == kLocalHeader,
                 "{}: not a PyTorch checkpoint (not a zip archive)", where);
  // The archive's directory and the pickle are read at open, right after the file was mapped; the tensors'
  // bytes, read later, are guarded against the file shrinking meanwhile (read_bytes).
  const std::vector<ZipRecord> records = read_zip_records(archive, where);
  std::map<std::string, const ZipRecord*> by_name;
  const ZipRecord* pickle = nullptr;
  for (const auto& record : records) {
    by_name.emplace(record.name, &record);
    if (record.name.ends_with("data.pkl") && std::count(record.name.begin(), record.name.end(), '/') == 1 &&
        record.name.find('/') + 9 == record.name.size()) {
      SYMPRUNE_CHECK(pickle == nullptr, "{}: two data.pkl records ({} and {})", where, pickle->name,
                     record.name);
      pickle = &record;
    }
  }
  SYMPRUNE_CHECK(pickle != nullptr,
                 "{}: a zip archive without a PREFIX/data.pkl record: not a PyTorch checkpoint", where);
  SYMPRUNE_CHECK(pickle->size <= kMaxTorchPickleBytes,
                 "{}: its data.pkl holds {} bytes, more than the {} a state dict's needs (corrupt?)", where,
                 pickle->size, kMaxTorchPickleBytes);
  const std::string prefix = pickle->name.substr(0, pickle->name.size() - 8);
  if (const auto it = by_name.find(prefix + "byteorder"); it != by_name.end()) {
    const std::string order(reinterpret_cast<const char*>(file.map_.data() + it->second->offset),
                            static_cast<size_t>(std::min<uint64_t>(it->second->size, 16)));
    SYMPRUNE_CHECK(order == "little",
                   "{}: tensors stored in '{}' byte order; symprune reads little-endian only", where, order);
  }

  const std::vector<TorchTensorRef> refs =
      unpickle_state_dict(archive.subspan(pickle->offset, pickle->size), where + " (data.pkl)");
  for (const auto& ref : refs) {
    const std::string what = fmt::format("{}: tensor '{}'", where, ref.name);
    check_tensor_name(ref.name, where);
    const auto it = by_name.find(prefix + "data/" + ref.storage);
    SYMPRUNE_CHECK(it != by_name.end(), "{}: its storage record {}data/{} is missing", what, prefix,
                   ref.storage);
    const ZipRecord& record = *it->second;
    const uint64_t element = static_cast<uint64_t>(dtype_size(ref.dtype));
    SYMPRUNE_CHECK(
        record.size % element == 0 && record.size / element == static_cast<uint64_t>(ref.storage_numel),
        "{}: its storage record {} holds {} bytes, but the pickle says {} elements of {}: truncated "
        "or corrupt",
        what, record.name, record.size, ref.storage_numel, dtype_name(ref.dtype));
    SYMPRUNE_CHECK(ref.storage_offset >= 0 && ref.storage_offset <= ref.storage_numel,
                   "{}: storage offset {} outside its storage of {} elements", what, ref.storage_offset,
                   ref.storage_numel);
    // Element count, and the highest element the view reaches, overflow-checked. A view holds at most as many
    // elements as its storage (a broadcast view of a few stored values would make a huge tensor of a small
    // file); torch.save writes parameters and buffers as they are, never such views.
    int64_t numel = 1;
    for (const int64_t extent : ref.shape) {
      SYMPRUNE_CHECK(extent >= 0, "{}: negative size in {}", what, shape_to_string(ref.shape));
      SYMPRUNE_CHECK(!__builtin_mul_overflow(extent, numel, &numel), "{}: size {} overflows", what,
                     shape_to_string(ref.shape));
    }
    SYMPRUNE_CHECK(
        numel <= ref.storage_numel,
        "{}: a view of {} elements over a storage of {}: a broadcast (expanded) tensor; save it with "
        ".contiguous()",
        what, numel, ref.storage_numel);
    int64_t last = ref.storage_offset, expected_stride = 1;
    bool contiguous = true;
    for (size_t d = ref.shape.size(); numel > 0 && d-- > 0;) {
      const int64_t extent = ref.shape[d], stride = ref.stride[d];
      SYMPRUNE_CHECK(stride >= 0, "{}: negative stride in {}", what, shape_to_string(ref.stride));
      int64_t reach = 0;
      SYMPRUNE_CHECK(
          !__builtin_mul_overflow(extent - 1, stride, &reach) && !__builtin_add_overflow(last, reach, &last),
          "{}: stride {} overflows", what, shape_to_string(ref.stride));
      if (extent != 1 && stride != expected_stride) contiguous = false;
      expected_stride *= extent;  // at most numel: no overflow
    }
    SYMPRUNE_CHECK(numel == 0 || last < ref.storage_numel,
                   "{}: reaches element {} of a storage of {} (record {}): corrupt", what, last,
                   ref.storage_numel, record.name);
    TensorInfo info;
    info.name = ref.name;
    info.dtype = ref.dtype;
    info.shape = ref.shape;
    info.data_begin = record.offset + static_cast<uint64_t>(ref.storage_offset) * element;
    info.data_end =
        info.data_begin + static_cast<uint64_t>(numel) * element;  // row-major size: within the record
    file.index_.emplace(ref.name, file.tensors_.size());
    file.tensors_.push_back(std::move(info));
    file.views_.push_back(
        {record.offset, record.offset + record.size, ref.storage_offset, ref.stride, contiguous});
  }
  return file;
}

const TensorInfo* TorchCheckpointFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void TorchCheckpointFile::read_bytes(const TensorInfo& info, std::vector<std::byte>& out) const {
  const auto it = index_.find(info.name);
  SYMPRUNE_ASSERT(it != index_.end() && &tensors_[it->second] == &info, "tensor {} not in {}", info.name,
                  path_.string());
  const View& view = views_[it->second];
  const size_t element = static_cast<size_t>(dtype_size(info.dtype));
  const int64_t numel = info.numel();
  out.resize(static_cast<size_t>(numel) * element);
  if (numel == 0) return;
  // The file may shrink under the mapping: checked against its size now, and SIGBUS-guarded while copying.
  SYMPRUNE_CHECK(map_.current_size(path_) >= view.storage_end,
                 "{}: the file shrank while it was being read (tensor '{}')", path_.string(), info.name);
  const size_t dims = info.shape.size();
  std::vector<int64_t> index(dims, 0);  // outside the guarded copy, which is left by siglongjmp on SIGBUS
  read_mapped(path_, [&] {
    if (view.contiguous) {
      std::memcpy(out.data(), map_.data() + info.data_begin, out.size());
      return;
    }
    // A strided view: walk its elements in row-major order.
    for (int64_t i = 0; i < numel; ++i) {
      int64_t source = view.storage_offset;
      for (size_t d = 0; d < dims; ++d) source += index[d] * view.stride[d];
      std::memcpy(out.data() + static_cast<size_t>(i) * element,
                  map_.data() + view.storage_begin + static_cast<uint64_t>(source) * element, element);
      for (size_t d = dims; d-- > 0;) {
        if (++index[d] < info.shape[d]) break;
        index[d] = 0;
      }
    }
  });
  // As for safetensors: the pipeline reads each tensor once per pass, so its pages leave this process (they
  // stay in the page cache) and resident memory does not grow with every block read.
  if (view.contiguous) release_pages({map_.data() + info.data_begin, out.size()});
}

// ---------------------------------------------------------------------------------------------
// TorchModel

bool has_torch_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / kSafetensorsIndexFile, ec)) return false;
  return fs::exists(dir / kTorchSingleFile, ec) || fs::exists(dir / kTorchIndexFile, ec);
}

std::vector<fs::path> torch_weight_files(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / kTorchSingleFile, ec)) return {kTorchSingleFile};
  std::vector<fs::path> out{kTorchIndexFile};
  for (auto& shard : index_shard_names(dir / kTorchIndexFile)) out.push_back(std::move(shard));
  return out;
}

std::unique_ptr<TensorSource> open_weights_dir(const fs::path& dir) {
  if (has_torch_checkpoint(dir)) return TorchModel::open_dir(dir);
  return std::make_unique<SafetensorsModel>(SafetensorsModel::open_dir(dir));
}

std::unique_ptr<TorchModel> TorchModel::open_dir(const fs::path& dir) {
  auto model = std::unique_ptr<TorchModel>(new TorchModel());
  model->dir_ = dir;
  std::error_code ec;
  const fs::path single = dir / kTorchSingleFile;
  if (fs::exists(single, ec)) {
    model->file_names_.push_back(kTorchSingleFile);
    model->files_.push_back(std::make_unique<TorchCheckpointFile>(TorchCheckpointFile::open(single)));
    for (const auto& info : model->files_[0]->tensors()) model->location_.emplace(info.name, 0);
    return model;
  }
  model->indexed_ = true;
  const fs::path index = dir / kTorchIndexFile;
  IndexedShards<TorchCheckpointFile> shards = read_indexed_shards<TorchCheckpointFile>(dir, index);
  model->file_names_ = std::move(shards.names);
  model->files_ = std::move(shards.files);
  model->location_ = std::move(shards.location);
  std::set<std::string> written;
  for (size_t i = 0; i < model->files_.size(); ++i) {
    // A shard written as model.safetensors would be read as the whole model: loaders prefer it to an index.
    SYMPRUNE_CHECK(
        safetensors_name_for(model->file_names_[i]) != "model.safetensors",
        "{}: shard {} would be written as model.safetensors, which loaders take for the whole model; "
        "rename the shard (e.g. pytorch_model-00001-of-00002.bin) and its entries in the index",
        index.string(), model->file_names_[i]);
    SYMPRUNE_CHECK(written.insert(safetensors_name_for(model->file_names_[i])).second,
                   "{}: two shards would both be written as {}", index.string(),
                   safetensors_name_for(model->file_names_[i]));
  }
  return model;
}

const TorchCheckpointFile& TorchModel::file_of(std::string_view name) const {
  const auto it = location_.find(name);
  SYMPRUNE_CHECK(it != location_.end(), "missing tensor '{}' in {}", name, description());
  return *files_[it->second];
}

bool TorchModel::contains(std::string_view name) const {
  return location_.find(name) != location_.end();
}

std::vector<std::string> TorchModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : location_) out.push_back(name);
  return out;
}

const TensorInfo& TorchModel::info(std::string_view name) const {
  return *file_of(name).find(name);
}

std::string TorchModel::location(std::string_view name) const {
  return file_of(name).path().string();
}

std::string TorchModel::description() const {
  return (dir_ / (indexed_ ? kTorchIndexFile : kTorchSingleFile)).string();
}

void TorchModel::read_bytes(std::string_view name, std::vector<std::byte>& out) const {
  const TorchCheckpointFile& file = file_of(name);
  file.read_bytes(*file.find(name), out);
}

std::vector<TensorSource::Shard> TorchModel::shards() const {
  std::vector<Shard> out;
  for (size_t i = 0; i < files_.size(); ++i) {
    // transformers loads safetensors only with a "format" entry in the metadata.
    Shard shard{safetensors_name_for(file_names_[i]), {}, {{"format", "pt"}}};
    for (const auto& info : files_[i]->tensors())
      if (location_.at(info.name) == i) shard.tensors.push_back(info.name);
    out.push_back(std::move(shard));
  }
  std::sort(out.begin(), out.end(), [](const Shard& a, const Shard& b) { return a.file < b.file; });
  return out;
}

std::vector<std::string> TorchModel::input_weight_files() const {
  std::vector<std::string> out = file_names_;
  if (indexed_) out.push_back(kTorchIndexFile);
  return out;
}

}  // namespace symprune::io
