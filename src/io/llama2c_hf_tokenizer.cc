// tokenizer.json for a llama2.c vocabulary (see llama2c_tokenizer.h). Why it reproduces run.c:
//  - run.c prepends " " to non-empty text and looks each code point up, else emits its bytes as <0xNN>
//    (id byte + 3): a Prepend("▁") + Replace(" ", "▁") normalizer with no pre-tokenizer (the whole text
//    is one word) and a byte-fallback BPE model do the same, with the pieces' spaces spelled '▁'.
//  - run.c then merges, while any exists, the adjacent pair whose concatenation is a piece of the highest
//    score (leftmost on ties). tokenizers' BPE merges the listed pair of lowest rank (leftmost on ties):
//    listing every pair that concatenates to a piece, ranked by that piece's score, makes the choices equal.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "io/llama2c_tokenizer.h"
#include "io/text_file.h"

namespace symprune::io {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's space
constexpr const char* kSpecialNames[] = {"<unk>", "<s>", "</s>"};
constexpr size_t kFirstByteId = 3;       // <0x00>
constexpr float kNoMergeScore = -1e10f;  // run.c merges only pieces scoring above this

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, from.size()) == from) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// Token names as tokenizers sees them; throws when run.c's pieces cannot all be told apart there.
std::vector<std::string> token_names(const Llama2cVocabulary& v) {
  std::vector<std::string> names;
  names.reserve(v.pieces.size());
  for (size_t id = 0; id < v.pieces.size(); ++id) {
    const std::string& piece = v.pieces[id];
    if (id < std::size(kSpecialNames)) {
      names.emplace_back(kSpecialNames[id]);  // llama2.c stores them as "<unk>", "\n<s>\n", "\n</s>\n"
      continue;
    }
    if (id >= kFirstByteId && id < kFirstByteId + 256) {
      const std::string byte = fmt::format("<0x{:02X}>", id - kFirstByteId);
      SYMPRUNE_CHECK(piece == byte,
                     "piece {} is '{}', not the byte token {} that byte fallback needs at this id", id, piece,
                     byte);
    }
    SYMPRUNE_CHECK(is_valid_utf8(piece), "piece {} is not valid UTF-8", id);
    SYMPRUNE_CHECK(piece.find(kMetaspace) == std::string::npos,
                   "piece {} contains '\u2581', which stands for a space in tokenizer.json", id);
    names.push_back(replace_all(piece, " ", kMetaspace));
  }
  return names;
}

}  // namespace

std::string llama2c_hf_tokenizer_json(const Llama2cVocabulary& v) {
  SYMPRUNE_CHECK(v.pieces.size() >= kFirstByteId + 256 && v.scores.size() == v.pieces.size(),
                 "{} pieces: fewer than <unk>, <s>, </s> and 256 byte tokens", v.pieces.size());
  const std::vector<std::string> names = token_names(v);
  std::unordered_map<std::string_view, size_t> ids;
  for (size_t id = 0; id < names.size(); ++id) {
    const auto [it, inserted] = ids.emplace(names[id], id);
    SYMPRUNE_CHECK(inserted, "pieces {} and {} are both '{}'", it->second, id, names[id]);
  }
  // run.c's dummy prefix is the " " piece; without one it would emit byte 0x20, tokenizers
  // <0xE2><0x96><0x81>.
  SYMPRUNE_CHECK(ids.count(kMetaspace) > 0, "no ' ' piece for the space run.c puts before the text");

  // Every split of every piece into two pieces (ordinary ones: specials never merge), best score first.
  std::vector<std::tuple<float, size_t, size_t>> merges;  // (score, piece id, split byte)
  for (size_t id = kFirstByteId; id < names.size(); ++id) {
    if (!(v.scores[id] > kNoMergeScore)) continue;
    const std::string_view name = names[id];
    for (size_t split = 1; split < name.size(); ++split) {
      if ((static_cast<unsigned char>(name[split]) & 0xC0) == 0x80) continue;  // inside a character
      const auto left = ids.find(name.substr(0, split)), right = ids.find(name.substr(split));
      if (left != ids.end() && right != ids.end() && left->second >= kFirstByteId &&
          right->second >= kFirstByteId)
        merges.emplace_back(v.scores[id], id, split);
    }
  }
  std::sort(merges.begin(), merges.end(), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
    return std::make_pair(std::get<1>(a), std::get<2>(a)) < std::make_pair(std::get<1>(b), std::get<2>(b));
  });

  json vocab = json::object();
  for (size_t id = 0; id < names.size(); ++id) vocab[names[id]] = id;
  json merge_list = json::array();
  for (const auto& [score, id, split] : merges) {
    const std::string& name = names[id];
    merge_list.push_back(name.substr(0, split) + " " + name.substr(split));  // names hold no ' '
  }
  json added = json::array();
  for (size_t id = 0; id < std::size(kSpecialNames); ++id) {
    added.push_back({{"id", id},
                     {"content", kSpecialNames[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const auto replace = [](std::string_view from, std::string_view to) {
    return json{
        {"type", "Replace"}, {"pattern", {{"String", std::string(from)}}}, {"content", std::string(to)}};
  };
  const json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", std::string(kMetaspace)}}, replace(" ", kMetaspace)}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {bos,
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {replace(kMetaspace, " "),
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return tokenizer.dump(2) + "\n";
}

}  // namespace symprune::io
