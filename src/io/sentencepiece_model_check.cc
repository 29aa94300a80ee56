#include "io/sentencepiece_model_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace symprune::io {
namespace {

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5;
// Field numbers of sentencepiece_model.proto: ModelProto, SentencePiece, NormalizerSpec, SelfTestData.
constexpr uint32_t kPieces = 1, kNormalizerSpec = 3, kSelfTestData = 4, kDenormalizerSpec = 5;
constexpr uint32_t kPieceText = 1, kPieceType = 3;
constexpr uint32_t kPrecompiledCharsmap = 2;
constexpr uint32_t kSamples = 1, kSampleInput = 1;
constexpr int32_t kUserDefinedType = 4;  // SentencePiece.Type.USER_DEFINED
constexpr int kMaxGroupDepth = 100;      // protobuf's own default recursion limit

struct Field {
  uint32_t number = 0;
  int wire_type = 0;
  uint64_t value = 0;        // a varint field's value
  std::string_view payload;  // a length-delimited field's bytes
};

// Reads the fields of one protobuf message in order; `error` is set (and next() returns false) when the
// message is cut short or malformed. Groups (deprecated, wire types 3/4) are skipped whole. Tags are read
// as libsentencepiece's protobuf-lite reads them, at most 5 bytes; one whose value does not fit 32 bits is
// refused, since protobuf-lite would drop the high bits and read a different field than this check did.
class WireReader {
 public:
  WireReader(std::string_view message, std::string& error) : data_(message), error_(error) {}

  size_t position() const { return pos_; }

  bool next(Field& field) {
    field = {};
    if (pos_ == data_.size()) return false;
    uint32_t tag = 0;
    if (!read_tag(tag)) return false;
    field.number = tag >> 3;
    field.wire_type = static_cast<int>(tag & 7);
    if (field.number == 0) return broken("field number 0");
    switch (field.wire_type) {
      case kVarint:
        return varint(field.value);
      case kLengthDelimited:
        if (!varint(field.value)) return false;
        if (field.value > data_.size() - pos_) return broken("a field longer than the rest of the message");
        field.payload = data_.substr(pos_, field.value);
        pos_ += field.value;
        return true;
      case kStartGroup:
        return skip_group(field.number, 1);
      default:
        return skip_scalar(field.wire_type);
    }
  }

 private:
  bool broken(std::string_view what) {
    error_ = fmt::format("malformed protobuf at byte {}: {}", pos_, what);
    return false;
  }

  bool read_tag(uint32_t& tag) {
    uint64_t value = 0;
    const size_t start = pos_;
    if (!varint(value)) return false;
    if (pos_ - start > 5 || value > UINT32_MAX) return broken("a field tag longer than 32 bits");
    tag = static_cast<uint32_t>(value);
    return true;
  }

  bool varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == data_.size()) return broken("truncated varint");
      const auto byte = static_cast<uint8_t>(data_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return broken("varint longer than 10 bytes");
  }

  bool skip_bytes(uint64_t count) {
    if (count > data_.size() - pos_) return broken("truncated field");
    pos_ += count;
    return true;
  }

  bool skip_scalar(int wire_type) {
    uint64_t ignored = 0;
    switch (wire_type) {
      case kVarint:
        return varint(ignored);
      case kFixed64:
        return skip_bytes(8);
      case kFixed32:
        return skip_bytes(4);
      case kLengthDelimited:
        return varint(ignored) && skip_bytes(ignored);
      default:
        return broken(fmt::format("wire type {}", wire_type));
    }
  }

  bool skip_group(uint32_t number, int depth) {
    if (depth > kMaxGroupDepth) return broken("groups nested too deeply");
    for (;;) {
      uint32_t tag = 0;
      if (!read_tag(tag)) return false;
      const auto wire_type = static_cast<int>(tag & 7);
      if (wire_type == kEndGroup) return (tag >> 3) == number ? true : broken("mismatched end of group");
      if (wire_type == kStartGroup) {
        if (!skip_group(tag >> 3, depth + 1)) return false;
      } else if (!skip_scalar(wire_type)) {
        return false;
      }
    }
  }

  std::string_view data_;
  std::string& error_;
  size_t pos_ = 0;
};

// darts-clone's double-array unit (darts.h, DoubleArrayUnit), as libsentencepiece reads it.
struct TrieUnit {
  uint32_t bits;
  bool has_leaf() const { return ((bits >> 8) & 1) == 1; }
  uint32_t value() const { return bits & ((1U << 31) - 1); }
  uint32_t label() const { return bits & ((1U << 31) | 0xFF); }
  uint32_t offset() const { return (bits >> 10) << ((bits & (1U << 9)) >> 6); }
};

// What is unsafe in one precompiled_charsmap; empty when a lookup of any input stays inside it and within
// the library's limits. A lookup (darts-clone's commonPrefixSearch) starts at state offset(unit[0]) and,
// for each input byte c, reads unit[state ^ c]; when that unit's label is c it moves to (state ^ c) ^ its
// offset, and if the unit has a leaf, a rule matches: its replacement starts at value(unit[new state]) in
// the NUL-separated strings after the trie. States form a DAG (darts-clone shares common suffixes); every
// reachable state is walked once, depth first, to find the most rules and bytes along any path.
std::string check_charsmap(std::string_view blob) {
  if (blob.empty()) return {};  // no rules: the identity normalizer
  if (blob.size() <= 4) return fmt::format("{} bytes, too short to hold a trie", blob.size());
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian, as libsentencepiece reads it on x86-64
  if (trie_bytes > blob.size() - 4)
    return fmt::format("its trie of {} bytes does not fit in {} bytes", trie_bytes, blob.size() - 4);
  const uint32_t units = trie_bytes / 4;
  if (units == 0) return "its trie is empty";
  const std::string_view strings = blob.substr(4 + static_cast<size_t>(trie_bytes));
  const char* trie = blob.data() + 4;
  const auto unit_at = [&](uint32_t index) {
    TrieUnit unit{};
    std::memcpy(&unit.bits, trie + 4 * static_cast<size_t>(index), 4);
    return unit;
  };
  // The 256 successors state ^ c of a state (any byte c) must all be inside the trie.
  const auto outside = [&](uint32_t state) { return (static_cast<uint64_t>(state) | 0xFF) >= units; };
  const auto leads_outside = [&](uint32_t state) {
    return fmt::format("trie state {} leads outside the trie ({} units)", state, units);
  };
  const std::string key_too_long =
      fmt::format("a rule key is longer than {} bytes", kMaxSentencePieceRuleBytes);

  enum : uint8_t { kUnvisited, kOnPath, kDone };
  std::vector<uint8_t> visit(units, kUnvisited);
  // The most rules (leaves) and bytes along any path from each finished state; capped one above the limits.
  std::vector<uint16_t> rules_below(units, 0), bytes_below(units, 0);
  struct Frame {
    uint32_t state;
    uint32_t byte;  // the next input byte to follow from this state
  };
  const uint32_t root = unit_at(0).offset();
  if (outside(root)) return leads_outside(root);
  std::vector<Frame> path{{root, 0}};
  visit[root] = kOnPath;
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.byte == 256) {
      visit[frame.state] = kDone;
      path.pop_back();
      continue;
    }
    const uint32_t child = frame.state ^ frame.byte;
    const TrieUnit unit = unit_at(child);
    if (unit.label() != frame.byte) {
      ++frame.byte;
      continue;
    }
    const uint32_t next = child ^ unit.offset();
    if (outside(next)) return leads_outside(next);
    if (unit.has_leaf()) {  // checked for every edge: a state may be reached by several
      const uint32_t start = unit_at(next).value();
      if (start >= strings.size())
        return fmt::format("trie unit {} points at replacement byte {} of {}", next, start, strings.size());
      const size_t length = strings.substr(start, kMaxSentencePieceReplacementBytes + 1).find('\0');
      if (length == std::string_view::npos && strings.size() - start > kMaxSentencePieceReplacementBytes)
        return fmt::format("the replacement at byte {} is longer than the {} bytes accepted", start,
                           kMaxSentencePieceReplacementBytes);
    }
    if (visit[next] == kOnPath) return fmt::format("trie state {} loops back to itself", next);
    if (visit[next] == kUnvisited) {
      // The key grows to path.size() bytes: a deep path stops here; a longer key through a shared state is
      // caught below, as the lengths below each state add up towards the root.
      if (path.size() > kMaxSentencePieceRuleBytes) return key_too_long;
      visit[next] = kOnPath;
      path.push_back({next, 0});  // `frame` is not used past this point: push_back may move it
      continue;
    }
    // `next` is finished: this edge extends the longest paths below it by one byte (and one rule).
    const auto rules = static_cast<uint16_t>(rules_below[next] + (unit.has_leaf() ? 1 : 0));
    const auto bytes = static_cast<uint16_t>(bytes_below[next] + 1);
    if (rules > kMaxSentencePieceRulesPerInput)
      return fmt::format("more than {} rules match one input, the most libsentencepiece holds",
                         kMaxSentencePieceRulesPerInput);
    if (bytes > kMaxSentencePieceRuleBytes) return key_too_long;
    rules_below[frame.state] = std::max(rules_below[frame.state], rules);
    bytes_below[frame.state] = std::max(bytes_below[frame.state], bytes);
    ++frame.byte;
  }
  return {};
}

// A piece as libsentencepiece keeps it: the last `piece` and the last valid `type` given.
struct Piece {
  std::string_view text;
  int32_t type = 1;  // NORMAL
};

std::string read_piece(std::string_view message, size_t index, Piece& piece, std::string& error) {
  WireReader reader(message, error);
  Field field;
  while (reader.next(field)) {
    if (field.number == kPieceText && field.wire_type == kLengthDelimited) piece.text = field.payload;
    // protobuf-lite reads an enum's varint as int32 and keeps values outside the enum (1..6) aside.
    const auto type = static_cast<int32_t>(static_cast<uint32_t>(field.value));
    if (field.number == kPieceType && field.wire_type == kVarint && type >= 1 && type <= 6) piece.type = type;
  }
  if (!error.empty()) return fmt::format("piece {}: {}", index, error);
  if (piece.text.size() > kMaxSentencePieceBytes)
    return fmt::format("piece {} is {} bytes long, more than the {} accepted", index, piece.text.size(),
                       kMaxSentencePieceBytes);
  return {};
}

// User-defined pieces are matched by a darts-clone trie of their texts up to the first NUL; the library
// keeps at most 64 of the matches at one input position and reads past them when there are more. The
// most matches at one position is the longest chain of keys each a prefix of the next.
std::string check_user_defined_chain(std::vector<std::string_view> keys) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<std::string_view> chain;  // in sorted order a prefix comes right before its extensions
  for (const std::string_view key : keys) {
    while (!chain.empty() && !key.starts_with(chain.back())) chain.pop_back();
    chain.push_back(key);
    if (chain.size() > kMaxSentencePieceUserDefinedMatches)
      return fmt::format(
          "more than {} user-defined pieces are prefixes of one another, the most libsentencepiece holds",
          kMaxSentencePieceUserDefinedMatches);
  }
  return {};
}

// The first problem in a NormalizerSpec (field `name` of ModelProto); empty when there is none.
std::string check_normalizer(std::string_view spec, const char* name, std::string& error) {
  WireReader reader(spec, error);
  Field field;
  while (reader.next(field)) {
    if (field.number != kPrecompiledCharsmap || field.wire_type != kLengthDelimited) continue;
    if (auto problem = check_charsmap(field.payload); !problem.empty())
      return fmt::format("{}.precompiled_charsmap is corrupt: {}", name, problem);
  }
  return error.empty() ? std::string() : fmt::format("{}: {}", name, error);
}

// Adds the input bytes of a SelfTestData's samples to `input_bytes`; the problem, if its structure is broken.
std::string add_self_test_input(std::string_view data, uint64_t& input_bytes, std::string& error) {
  WireReader reader(data, error);
  Field sample;
  while (reader.next(sample)) {
    if (sample.number != kSamples || sample.wire_type != kLengthDelimited) continue;
    WireReader sample_reader(sample.payload, error);
    Field field;
    while (sample_reader.next(field))
      if (field.number == kSampleInput && field.wire_type == kLengthDelimited)
        input_bytes += field.payload.size();
    if (!error.empty()) break;
  }
  return error.empty() ? std::string() : fmt::format("self_test_data: {}", error);
}

}  // namespace

SentencePieceModelCheck check_sentencepiece_model(std::string_view serialized_model) {
  SentencePieceModelCheck check;
  std::string error;
  WireReader model(serialized_model, error);
  Field field;
  std::vector<std::string_view> user_defined_keys;
  std::vector<std::pair<size_t, size_t>> self_test_fields;  // [start, end) of each ModelProto field 4
  size_t pieces = 0;
  for (size_t start = model.position(); model.next(field); start = model.position()) {
    if (field.wire_type != kLengthDelimited) continue;
    std::string problem;
    if (field.number == kPieces) {
      Piece piece;
      problem = read_piece(field.payload, pieces++, piece, error);
      const std::string_view key = piece.text.substr(0, piece.text.find('\0'));
      if (piece.type == kUserDefinedType && !key.empty()) user_defined_keys.push_back(key);
    } else if (field.number == kNormalizerSpec) {
      problem = check_normalizer(field.payload, "normalizer_spec", error);
    } else if (field.number == kDenormalizerSpec) {
      problem = check_normalizer(field.payload, "denormalizer_spec", error);
    } else if (field.number == kSelfTestData) {
      problem = add_self_test_input(field.payload, check.self_test_bytes, error);
      self_test_fields.emplace_back(start, model.position());
    }
    if (!problem.empty()) {
      check.problem = std::move(problem);
      return check;
    }
  }
  check.problem = error.empty() ? check_user_defined_chain(std::move(user_defined_keys)) : error;
  if (!check.problem.empty()) return check;
  check.self_test_left_out = check.self_test_bytes > kMaxSentencePieceSelfTestBytes;
  if (!check.self_test_left_out) {
    check.model_to_load = serialized_model;
    return check;
  }
  size_t kept_from = 0;
  for (const auto& [start, end] : self_test_fields) {
    check.model_to_load.append(serialized_model.substr(kept_from, start - kept_from));
    kept_from = end;
  }
  check.model_to_load.append(serialized_model.substr(kept_from));
  return check;
}

}  // namespace symprune::io
