#include "io/convert_llama2c.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/llama2c_checkpoint.h"
#include "io/llama2c_tokenizer.h"
#include "io/output_dir.h"
#include "io/safetensors.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;

// Tokenizer files are small (LLaMA-2's is 0.5 MB); the cap only bounds hostile input.
constexpr uint64_t kMaxTokenizerBytes = 256ull << 20;

enum class TokenizerKind { kLlama2c, kSentencePiece };

struct TokenizerFile {
  TokenizerKind kind = TokenizerKind::kLlama2c;
  std::string bytes;  // written out as read, so what was validated is what lands in the directory
};

std::string read_small_file(const fs::path& path, const char* what) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  SYMPRUNE_CHECK(fs::exists(status), "cannot open {} '{}': no such file", what, path.string());
  SYMPRUNE_CHECK(!ec, "cannot open {} '{}': {}", what, path.string(), ec.message());
  SYMPRUNE_CHECK(fs::is_regular_file(status), "{} '{}' is not a regular file", what, path.string());
  const uint64_t size = fs::file_size(path, ec);
  SYMPRUNE_CHECK(!ec, "cannot read the size of {} '{}': {}", what, path.string(), ec.message());
  SYMPRUNE_CHECK(size <= kMaxTokenizerBytes, "{} '{}' is {} bytes, larger than the {}-byte limit", what,
                 path.string(), size, kMaxTokenizerBytes);
  std::ifstream in(path, std::ios::binary);
  SYMPRUNE_CHECK(in.good(), "cannot open {} '{}': {}", what, path.string(), std::strerror(errno));
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  SYMPRUNE_CHECK(static_cast<uint64_t>(in.gcount()) == size, "short read from {} '{}'", what, path.string());
  return bytes;
}

// Checks a llama2.c tokenizer.bin: int32 max_token_length, then vocab_size records of
// {f32 score, int32 length, bytes}, ending exactly at the end of the file. Returns "" when valid,
// else why not.
std::string llama2c_tokenizer_problem(const std::string& bytes, int64_t vocab_size) {
  auto read_i32 = [&](size_t at, int32_t& out) {
    if (at + 4 > bytes.size()) return false;
    std::memcpy(&out, bytes.data() + at, 4);
    return true;
  };
  int32_t max_length = 0;
  if (!read_i32(0, max_length))
    return fmt::format("{} bytes, too short for the max_token_length field", bytes.size());
  if (max_length <= 0) return fmt::format("max_token_length is {}, expected > 0", max_length);
  size_t at = 4;
  for (int64_t token = 0; token < vocab_size; ++token) {
    int32_t length = 0;
    if (!read_i32(at + 4, length)) {
      return fmt::format("it ends at token {} of the checkpoint's vocab_size {}", token, vocab_size);
    }
    if (length < 0 || length > max_length) {
      return fmt::format("token {} has length {}, outside [0, max_token_length {}]", token, length,
                         max_length);
    }
    at += 8;
    if (bytes.size() - at < static_cast<size_t>(length)) {
      return fmt::format("token {} of length {} runs past the end of the file", token, length);
    }
    at += static_cast<size_t>(length);
  }
  if (at != bytes.size()) {
    return fmt::format(
        "{} bytes remain after the checkpoint's vocab_size {} tokens: a tokenizer of a larger "
        "vocabulary?",
        bytes.size() - at, vocab_size);
  }
  return "";
}

TokenizerFile load_tokenizer_file(const fs::path& path, int64_t vocab_size) {
  TokenizerFile file;
  file.bytes = read_small_file(path, "tokenizer");
  const bool named_model = path.extension() == ".model";
  std::string llama2c_problem;
  if (!named_model) {
    llama2c_problem = llama2c_tokenizer_problem(file.bytes, vocab_size);
    if (llama2c_problem.empty()) {
      file.kind = TokenizerKind::kLlama2c;
      return file;
    }
  }
  sentencepiece::SentencePieceProcessor processor;
  const auto status = processor.LoadFromSerializedProto(file.bytes);
  if (!status.ok()) {
    if (named_model)
      fail("tokenizer '{}' is not a valid SentencePiece model: {}", path.string(), status.ToString());
    fail(
        "tokenizer '{}' is neither a llama2.c tokenizer.bin for vocab_size {} ({}) nor a SentencePiece model",
        path.string(), vocab_size, llama2c_problem);
  }
  SYMPRUNE_CHECK(processor.GetPieceSize() == vocab_size,
                 "SentencePiece tokenizer '{}' has {} pieces but the checkpoint's vocab_size is {}",
                 path.string(), processor.GetPieceSize(), vocab_size);
  file.kind = TokenizerKind::kSentencePiece;
  return file;
}

void write_file(const fs::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask
  SYMPRUNE_CHECK(fd >= 0, "cannot create '{}': {}", path.string(), std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fail("cannot write '{}': {}", path.string(), std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;  // NFS and quotas may report a failed write only here
  SYMPRUNE_CHECK(synced, "cannot flush '{}': {}", path.string(), std::strerror(err));
  SYMPRUNE_CHECK(closed, "cannot close '{}': {}", path.string(), std::strerror(errno));
}

nlohmann::ordered_json make_config(const Llama2cHeader& h) {
  nlohmann::ordered_json config;
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "llama";
  config["hidden_size"] = h.dim;
  config["intermediate_size"] = h.hidden_dim;
  config["num_hidden_layers"] = h.n_layers;
  config["num_attention_heads"] = h.n_heads;
  config["num_key_value_heads"] = h.n_kv_heads;
  config["vocab_size"] = h.vocab_size;
  config["max_position_embeddings"] = h.seq_len;
  config["rms_norm_eps"] = 1e-5;  // llama2.c's RMSNorm epsilon
  config["rope_theta"] = kLlama2cRopeTheta;
  config["hidden_act"] = "silu";
  config["tie_word_embeddings"] = h.shared_classifier;
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  config["torch_dtype"] = "float32";
  config["attention_bias"] = false;
  config["mlp_bias"] = false;
  return config;
}

// No "tokenizer_file" key: transformers takes it as the path of tokenizer.json.
nlohmann::ordered_json make_tokenizer_config(TokenizerKind kind, const Llama2cHeader& h, bool hf_tokenizer) {
  nlohmann::ordered_json config;
  if (kind == TokenizerKind::kSentencePiece) {
    config["tokenizer_class"] = "LlamaTokenizer";
    config["unk_token"] = "<unk>";
    config["legacy"] = true;  // plain SentencePiece behaviour, as llama2.c tokenizes
  } else if (hf_tokenizer) {
    // tokenizer.json for Hugging Face tools; symprune reads tokenizer.bin (same ids).
    config["tokenizer_class"] = "LlamaTokenizerFast";
    config["unk_token"] = "<unk>";
    config["legacy"] = true;  // what tokenizer.json does (one '▁' prepended); also silences a notice
    config["clean_up_tokenization_spaces"] = false;
  }
  config["bos_token"] = "<s>";
  config["eos_token"] = "</s>";
  config["add_bos_token"] = true;
  config["add_eos_token"] = false;
  config["model_max_length"] = h.seq_len;
  return config;
}

void add_tensor(std::vector<TensorToWrite>& out, std::string name, const Tensor& tensor) {
  out.push_back({std::move(name), DType::kF32, tensor.shape(),
                 std::as_bytes(std::span<const float>(tensor.data(), static_cast<size_t>(tensor.numel())))});
}

}  // namespace

ConvertLlama2cSummary convert_llama2c(const fs::path& checkpoint, const fs::path& tokenizer,
                                      const fs::path& out_dir, bool force) {
  InputFootprint inputs;
  inputs.add_file(checkpoint);
  inputs.add_file(tokenizer);
  const OutputDirectory out(out_dir, inputs, force);

  Llama2cCheckpoint ck = load_llama2c_checkpoint(checkpoint);
  check_llama2c_rope_tables(ck, checkpoint);
  const Llama2cHeader& h = ck.header;
  const TokenizerFile tok = load_tokenizer_file(tokenizer, h.vocab_size);
  // The tokenizer.json twin of tokenizer.bin, so AutoTokenizer, lm-eval and vLLM load the model too.
  std::string hf_tokenizer_json;
  if (tok.kind == TokenizerKind::kLlama2c) {
    try {
      hf_tokenizer_json =
          llama2c_hf_tokenizer_json(parse_llama2c_vocabulary(tok.bytes, tokenizer, h.vocab_size));
    } catch (const Error& e) {
      log::warn("{}: no tokenizer.json written ({}); Hugging Face tools will not load this tokenizer",
                tokenizer.string(), e.what());
    }
  }

  // q/k rows go from llama2.c's interleaved RoPE pairs to Hugging Face's rotate-half layout.
  std::vector<Tensor> q_hf, k_hf;
  for (int64_t l = 0; l < h.n_layers; ++l) {
    q_hf.push_back(permute_rope_rows_to_hf(ck.wq[static_cast<size_t>(l)], h.n_heads));
    k_hf.push_back(permute_rope_rows_to_hf(ck.wk[static_cast<size_t>(l)], h.n_kv_heads));
  }
  std::vector<TensorToWrite> tensors;
  add_tensor(tensors, "model.embed_tokens.weight", ck.token_embedding);
  for (int64_t l = 0; l < h.n_layers; ++l) {
    const auto i = static_cast<size_t>(l);
    const std::string prefix = fmt::format("model.layers.{}.", l);
    add_tensor(tensors, prefix + "input_layernorm.weight", ck.rms_att[i]);
    add_tensor(tensors, prefix + "self_attn.q_proj.weight", q_hf[i]);
    add_tensor(tensors, prefix + "self_attn.k_proj.weight", k_hf[i]);
    add_tensor(tensors, prefix + "self_attn.v_proj.weight", ck.wv[i]);
    add_tensor(tensors, prefix + "self_attn.o_proj.weight", ck.wo[i]);
    add_tensor(tensors, prefix + "post_attention_layernorm.weight", ck.rms_ffn[i]);
    add_tensor(tensors, prefix + "mlp.gate_proj.weight", ck.w1[i]);
    add_tensor(tensors, prefix + "mlp.up_proj.weight", ck.w3[i]);
    add_tensor(tensors, prefix + "mlp.down_proj.weight", ck.w2[i]);
  }
  add_tensor(tensors, "model.norm.weight", ck.rms_final);
  if (!h.shared_classifier) add_tensor(tensors, "lm_head.weight", ck.wcls);

  const std::unique_ptr<StagedDirectory> staging = out.stage();
  StagedDirectory& tmp = *staging;
  const std::string tokenizer_name =
      tok.kind == TokenizerKind::kLlama2c ? "tokenizer.bin" : "tokenizer.model";
  try {
    write_safetensors(tmp.path() / "model.safetensors", tensors, {{"format", "pt"}});
    write_file(tmp.path() / "config.json", make_config(h).dump(2) + "\n");
    write_file(tmp.path() / tokenizer_name, tok.bytes);
    if (!hf_tokenizer_json.empty()) write_file(tmp.path() / "tokenizer.json", hf_tokenizer_json);
    write_file(tmp.path() / "tokenizer_config.json",
               make_tokenizer_config(tok.kind, h, !hf_tokenizer_json.empty()).dump(2) + "\n");
    nlohmann::json provenance = build_provenance();
    provenance["command"] = "convert-llama2c";
    provenance["checkpoint"] = checkpoint.string();
    provenance["tokenizer"] = tokenizer.string();
    write_provenance(tmp.path(), provenance);
  } catch (const Error& e) {
    throw Error(tmp.as_target(e.what()));  // name out/..., not the staged directory removed on the way out
  }
  tmp.install();

  ConvertLlama2cSummary summary;
  summary.version = h.version;
  summary.dim = h.dim;
  summary.hidden_dim = h.hidden_dim;
  summary.n_layers = h.n_layers;
  summary.n_heads = h.n_heads;
  summary.n_kv_heads = h.n_kv_heads;
  summary.vocab_size = h.vocab_size;
  summary.seq_len = h.seq_len;
  summary.tied = h.shared_classifier;
  summary.tokenizer_file = tokenizer_name;
  summary.hf_tokenizer_json = !hf_tokenizer_json.empty();
  return summary;
}

}  // namespace symprune::io
