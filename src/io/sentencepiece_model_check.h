// Checks the parts of a SentencePiece model that libsentencepiece trusts, before it may use them.
//
// libsentencepiece (0.1.97, Debian 12) crashes, instead of reporting an error, on two kinds of corrupt
// model, both found from outside:
//  - normalization rules: a NormalizerSpec (or DenormalizerSpec) holds `precompiled_charsmap`, a
//    little-endian uint32 trie size, a darts-clone double array of that many bytes, then the replacement
//    strings. The double array is walked without bounds checks (SIGSEGV in Normalizer::NormalizePrefix,
//    found by fuzzing). Every state a lookup could reach is walked here exactly as darts-clone's
//    commonPrefixSearch does, and the first index outside the array or the strings is reported.
//  - piece length: darts-clone builds its trie recursively, one stack frame per byte of a piece, so a
//    piece of ~100 KB overflows an 8 MiB stack (google/sentencepiece#1263). Real pieces are a few bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace symprune::io {

// Longest piece accepted: far beyond any real vocabulary, and well inside the stack darts-clone needs.
inline constexpr size_t kMaxSentencePieceBytes = 16384;

// Empty when the serialized ModelProto is safe to hand to libsentencepiece; otherwise what is wrong, e.g.
// "normalizer_spec.precompiled_charsmap is corrupt: trie state 1792 leads outside the trie (1024 units)".
// Also reports a protobuf structure broken before these parts could be read (truncated field, bad wire type).
std::string find_unsafe_sentencepiece_model(std::string_view serialized_model);

}  // namespace symprune::io
