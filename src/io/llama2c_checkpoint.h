#pragma once
// Reader for llama2.c checkpoints (karpathy/llama2.c export.py): the "legacy" v0 layout and the
// "version 1" layout (magic "ak42"). Both store fp32 weights in llama2.c's own conventions:
// q/k rows pair dimensions (2i, 2i+1) for RoPE (interleaved), unlike Hugging Face's rotate-half.
//
// v0: 7 x int32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
//     vocab_size < 0 means the classifier is not shared and is stored last), then fp32
//     token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
//     freq_cis_real [seq_len, head_size/2], freq_cis_imag, [wcls].
// v1: uint32 magic 0x616b3432, int32 version = 1, the same 7 int32 (vocab_size > 0), uint8
//     shared_classifier, zero padding to 256 bytes, then fp32 rms_att, rms_ffn, rms_final,
//     token_embedding, wq, wk, wv, wo, w1, w2, w3, [wcls] (no RoPE tables).
// Version 2 (Q8_0) is refused with a message. The file size must equal what the header implies.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/tensor.h"

namespace symprune::io {

inline constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42" as written by export.py
inline constexpr uint64_t kLlama2cV0HeaderBytes = 7 * 4;
inline constexpr uint64_t kLlama2cV1HeaderBytes = 256;
// llama2.c trains and exports with this RoPE base; its v0 tables are checked against it.
inline constexpr double kLlama2cRopeTheta = 10000.0;

struct Llama2cHeader {
  int version = 0;  // 0 (legacy) or 1
  int64_t dim = 0;
  int64_t hidden_dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t vocab_size = 0;  // always positive here; sharing is in shared_classifier
  int64_t seq_len = 0;
  bool shared_classifier = true;

  int64_t head_size() const { return dim / n_heads; }
  int64_t kv_dim() const { return head_size() * n_kv_heads; }
  uint64_t header_bytes() const { return version == 0 ? kLlama2cV0HeaderBytes : kLlama2cV1HeaderBytes; }
  // Header plus all fp32 tensors the header implies; overflow-checked (throws on overflow).
  uint64_t expected_file_bytes() const;
};

struct Llama2cCheckpoint {
  Llama2cHeader header;
  Tensor token_embedding;  // [vocab, dim]
  // One tensor per layer, llama2.c (unpermuted) row order; shapes as nn.Linear [out, in].
  std::vector<Tensor> rms_att;  // [dim]
  std::vector<Tensor> wq;       // [dim, dim]
  std::vector<Tensor> wk;       // [kv_dim, dim]
  std::vector<Tensor> wv;       // [kv_dim, dim]
  std::vector<Tensor> wo;       // [dim, dim]
  std::vector<Tensor> rms_ffn;  // [dim]
  std::vector<Tensor> w1;       // [hidden, dim]
  std::vector<Tensor> w2;       // [dim, hidden]
  std::vector<Tensor> w3;       // [hidden, dim]
  Tensor rms_final;             // [dim]
  Tensor freq_cis_real;         // [seq_len, head_size / 2]; empty for version 1
  Tensor freq_cis_imag;         // same
  Tensor wcls;                  // [vocab, dim]; empty when shared_classifier
};

// Parses and validates the header only (positive sizes, head divisibility, even head size,
// exact file size). Errors name the file and the problem.
Llama2cHeader read_llama2c_header(const std::filesystem::path& path);

// Reads the whole checkpoint (header validated first, then every tensor).
Llama2cCheckpoint load_llama2c_checkpoint(const std::filesystem::path& path);

// Checks the v0 RoPE tables against cos/sin(pos * theta^(-2i/head_size)); throws naming the file,
// the first disagreeing entry and the theta the table implies. No-op for version 1 (no tables).
void check_llama2c_rope_tables(const Llama2cCheckpoint& checkpoint, const std::filesystem::path& path,
                               double theta = kLlama2cRopeTheta);

// Reorders q/k projection rows from llama2.c's interleaved RoPE pairs (2i, 2i+1) to Hugging Face's
// rotate-half pairs (i, i + head_size/2), per head, exactly as convert_llama_weights_to_hf.py:
// w.view(n_heads, rows / n_heads / 2, 2, cols).transpose(1, 2).reshape(rows, cols).
Tensor permute_rope_rows_to_hf(const Tensor& weight, int64_t n_heads);

}  // namespace symprune::io
