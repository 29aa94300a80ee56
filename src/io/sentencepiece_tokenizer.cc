// SentencePiece .model tokenizers (LLaMA-2), through Debian's libsentencepiece so ids match the
// Python `sentencepiece` package exactly.
#include <sentencepiece_processor.h>

#include <exception>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/sentencepiece_model_check.h"
#include "io/tokenizer.h"

namespace symprune::io {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::filesystem::path& model_file, bool add_bos)
      : path_(model_file), add_bos_(add_bos) {
    std::ifstream in(model_file, std::ios::binary);
    SYMPRUNE_CHECK(in.good(), "cannot open SentencePiece model {}", model_file.string());
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SYMPRUNE_CHECK(!bytes.empty(), "SentencePiece model {} is empty", model_file.string());
    // libsentencepiece trusts parts of the model it should check; a corrupt one crashes it (found by
    // fuzzing).
    const SentencePieceModelCheck check = check_sentencepiece_model(bytes);
    SYMPRUNE_CHECK(check.problem.empty(), "SentencePiece model {} could not be loaded: {}",
                   model_file.string(), check.problem);
    if (check.self_test_left_out)
      log::warn("SentencePiece model {}: its self-test samples ({} bytes of input, over {}) are not run",
                model_file.string(), check.self_test_bytes, kMaxSentencePieceSelfTestBytes);
    sentencepiece::util::Status status;
    try {
      status = processor_.LoadFromSerializedProto(check.model_to_load);
    } catch (const std::exception& e) {
      // libsentencepiece reports some corrupt models by throwing from its bundled darts_clone (a piece
      // starting with NUL: "failed to insert key: zero-length key"), not by its Status (found by fuzzing).
      fail("SentencePiece model {} could not be loaded: {}", model_file.string(), e.what());
    }
    SYMPRUNE_CHECK(status.ok(), "SentencePiece model {} could not be loaded: {}", model_file.string(),
                   status.ToString());
    SYMPRUNE_CHECK(processor_.GetPieceSize() > 0, "SentencePiece model {} has no pieces",
                   model_file.string());
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    SYMPRUNE_CHECK(status.ok(), "SentencePiece model {}: encoding failed: {}", path_.string(),
                   status.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_bos && bos_id()) out.push_back(*bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    const int n = processor_.GetPieceSize();
    for (const int32_t id : ids)
      SYMPRUNE_CHECK(id >= 0 && id < n,
                     "SentencePiece model {}: token id {} is outside the vocabulary (size {})",
                     path_.string(), id, n);
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    SYMPRUNE_CHECK(status.ok(), "SentencePiece model {}: decoding failed: {}", path_.string(),
                   status.ToString());
    return text;
  }

  std::optional<int32_t> bos_id() const override {
    const int id = processor_.bos_id();
    return add_bos_ && id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  std::optional<int32_t> eos_id() const override {
    const int id = processor_.eos_id();
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::string kind() const override { return "sentencepiece"; }

 private:
  std::filesystem::path path_;
  bool add_bos_ = true;  // false: tokenizer_config.json's add_bos_token is false
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::filesystem::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file,
                                                  !tokenizer_config_disables_bos(model_file.parent_path()));
}

}  // namespace symprune::io
