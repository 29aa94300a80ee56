#include "io/sentencepiece_model_check.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace symprune::io {
namespace {

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5;
// ModelProto field numbers (sentencepiece_model.proto), with SentencePiece.piece and
// NormalizerSpec.precompiled_charsmap inside them.
constexpr uint64_t kPieces = 1, kNormalizerSpec = 3, kDenormalizerSpec = 5;
constexpr uint64_t kPieceText = 1, kPrecompiledCharsmap = 2;
constexpr int kMaxGroupDepth = 100;  // protobuf's own default recursion limit

struct Field {
  uint64_t number = 0;
  int wire_type = 0;
  std::string_view payload;  // the bytes of a length-delimited field; empty otherwise
};

// Reads the fields of one protobuf message in order; `error` is set (and next() returns false) when the
// message is cut short or malformed. Groups (deprecated, wire types 3/4) are skipped whole.
class WireReader {
 public:
  WireReader(std::string_view message, std::string& error) : data_(message), error_(error) {}

  bool next(Field& field) {
    if (pos_ == data_.size()) return false;
    uint64_t tag = 0;
    if (!varint(tag)) return false;
    field.number = tag >> 3;
    field.wire_type = static_cast<int>(tag & 7);
    field.payload = {};
    if (field.number == 0) return broken("field number 0");
    if (field.wire_type == kLengthDelimited) {
      uint64_t length = 0;
      if (!varint(length)) return false;
      if (length > data_.size() - pos_) return broken("a field longer than the rest of the message");
      field.payload = data_.substr(pos_, length);
      pos_ += length;
      return true;
    }
    if (field.wire_type == kStartGroup) return skip_group(field.number, 1);
    return skip_scalar(field.wire_type);
  }

 private:
  bool broken(std::string_view what) {
    error_ = fmt::format("malformed protobuf at byte {}: {}", pos_, what);
    return false;
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

  bool skip_group(uint64_t number, int depth) {
    if (depth > kMaxGroupDepth) return broken("groups nested too deeply");
    for (;;) {
      uint64_t tag = 0;
      if (!varint(tag)) return false;
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

// What is unsafe in one precompiled_charsmap; empty when a lookup of any input stays inside it. A lookup
// (commonPrefixSearch) starts at state offset(unit[0]) and, for each input byte c, reads unit[state ^ c];
// when that unit's label is c it moves to (state ^ c) ^ its offset, and if the unit has a leaf the
// replacement string starts at value(unit[new state]) in the strings that follow the trie.
std::string check_charsmap(std::string_view blob) {
  if (blob.empty()) return {};  // no rules: the identity normalizer
  if (blob.size() <= 4) return fmt::format("{} bytes, too short to hold a trie", blob.size());
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian, as libsentencepiece reads it on x86-64
  if (trie_bytes > blob.size() - 4)
    return fmt::format("its trie of {} bytes does not fit in {} bytes", trie_bytes, blob.size() - 4);
  const uint32_t units = trie_bytes / 4;
  if (units == 0) return "its trie is empty";
  const uint64_t strings_size = blob.size() - 4 - trie_bytes;
  const char* trie = blob.data() + 4;
  const auto unit_at = [&](uint32_t index) {
    TrieUnit unit{};
    std::memcpy(&unit.bits, trie + 4 * static_cast<size_t>(index), 4);
    return unit;
  };

  std::vector<bool> queued(units, false);
  std::vector<uint32_t> states;
  const auto enqueue = [&](uint32_t state) -> std::string {
    // The state's 256 successors state ^ c (any byte c) must all be inside the trie.
    if ((static_cast<uint64_t>(state) | 0xFF) >= units)
      return fmt::format("trie state {} leads outside the trie ({} units)", state, units);
    if (!queued[state]) {
      queued[state] = true;
      states.push_back(state);
    }
    return {};
  };
  if (auto problem = enqueue(unit_at(0).offset()); !problem.empty()) return problem;
  while (!states.empty()) {
    const uint32_t state = states.back();
    states.pop_back();
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t child = state ^ byte;
      const TrieUnit unit = unit_at(child);
      if (unit.label() != byte) continue;
      const uint32_t next = child ^ unit.offset();
      if (auto problem = enqueue(next); !problem.empty()) return problem;
      if (unit.has_leaf() && unit_at(next).value() >= strings_size)
        return fmt::format("trie unit {} points at replacement byte {} of {}", next, unit_at(next).value(),
                           strings_size);
    }
  }
  return {};
}

// The first problem in a piece (ModelProto.pieces[index]); empty when there is none.
std::string check_piece(std::string_view piece, size_t index, std::string& error) {
  WireReader reader(piece, error);
  Field field;
  while (reader.next(field))
    if (field.number == kPieceText && field.wire_type == kLengthDelimited &&
        field.payload.size() > kMaxSentencePieceBytes)
      return fmt::format("piece {} is {} bytes long, more than the {} accepted", index, field.payload.size(),
                         kMaxSentencePieceBytes);
  return error.empty() ? std::string() : fmt::format("piece {}: {}", index, error);
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

}  // namespace

std::string find_unsafe_sentencepiece_model(std::string_view serialized_model) {
  std::string error;
  WireReader model(serialized_model, error);
  Field field;
  size_t pieces = 0;
  while (model.next(field)) {
    if (field.wire_type != kLengthDelimited) continue;
    std::string problem;
    if (field.number == kPieces)
      problem = check_piece(field.payload, pieces++, error);
    else if (field.number == kNormalizerSpec)
      problem = check_normalizer(field.payload, "normalizer_spec", error);
    else if (field.number == kDenormalizerSpec)
      problem = check_normalizer(field.payload, "denormalizer_spec", error);
    if (!problem.empty()) return problem;
  }
  return error;
}

}  // namespace symprune::io
