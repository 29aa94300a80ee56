// Checks the parts of a SentencePiece model that libsentencepiece trusts, before it may use them.
//
// libsentencepiece (0.1.97, Debian 12) crashes, stalls or exhausts memory, instead of reporting an error,
// on corrupt models. Found by fuzzing and by a review of its source with crafted files:
//  - normalization rules: a NormalizerSpec (or DenormalizerSpec) holds `precompiled_charsmap`, a
//    little-endian uint32 trie size, a darts-clone double array of that many bytes, then the replacement
//    strings. The double array is walked without bounds checks (SIGSEGV in Normalizer::NormalizePrefix),
//    and more than 32 rules matching one input overrun a 32-entry array. Every state a lookup can reach
//    is walked here exactly as darts-clone's commonPrefixSearch does.
//  - user-defined pieces: more than 64 of them that are prefixes of one another overrun a 64-entry array
//    (PrefixMatcher::PrefixMatch).
//  - piece length: darts-clone builds its trie recursively, one stack frame per byte of a piece, so a
//    piece of ~100 KB overflows an 8 MiB stack (google/sentencepiece#1263).
//  - self-test samples, run at load: their cost grows with their size times the longest piece or rule
//    (and a run of unknown characters is merged quadratically), so large ones are left out of the load.
// The limits on sizes are well above what real models hold (NFKC's rules: keys of at most 10 bytes, at
// most 4 rules along one input, replacements of at most 33 bytes; pieces of a few dozen bytes).
// The protobuf structure is read as libsentencepiece's protobuf-lite reads it, so that no field it reads
// escapes this check (a tag longer than 32 bits, whose high bits it drops, is refused).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace symprune::io {

inline constexpr size_t kMaxSentencePieceBytes = 16384;             // one piece
inline constexpr size_t kMaxSentencePieceUserDefinedMatches = 64;   // library's PrefixMatcher array
inline constexpr size_t kMaxSentencePieceRulesPerInput = 32;        // library's Normalizer array
inline constexpr size_t kMaxSentencePieceRuleBytes = 256;           // one normalization rule's key
inline constexpr size_t kMaxSentencePieceReplacementBytes = 64;     // one rule's replacement
inline constexpr size_t kMaxSentencePieceSelfTestBytes = 8 * 1024;  // all self-test inputs together

struct SentencePieceModelCheck {
  // Empty when the model is safe to hand to libsentencepiece; otherwise what is wrong, e.g.
  // "normalizer_spec.precompiled_charsmap is corrupt: trie state 1792 leads outside the trie (1024 units)",
  // or a protobuf structure broken before these parts could be read (truncated field, bad wire type).
  std::string problem;
  // The serialized model to load: the input, less its self_test_data (ModelProto field 4) when the samples'
  // inputs add up to more than kMaxSentencePieceSelfTestBytes (they only check the library against the
  // trainer; the ids do not depend on them).
  std::string model_to_load;
  uint64_t self_test_bytes = 0;  // the samples' input bytes
  bool self_test_left_out = false;
};

SentencePieceModelCheck check_sentencepiece_model(std::string_view serialized_model);

}  // namespace symprune::io
