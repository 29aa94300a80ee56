#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets (tests/fuzz), built from the shared test data.

Usage: fuzz_seeds.py DATA_DIR OUT_DIR [--converted DIR]
Writes OUT_DIR/<target>/<name> for every target: small slices and variants of the real files (the
fuzzers run best on inputs of a few KB), so the fuzzer starts from valid, realistic structure.
--converted: a Hugging Face directory made by `symprune convert-llama2c` from stories260K; its
config.json and safetensors header (with the tensors shrunk) become seeds.
Needs only the standard library; the SentencePiece and tokenizers seeds are trained with those
Python packages when they are importable (they are in the project's .venv) and skipped otherwise.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys

PART_SEPARATOR = b"\n--symprune-fuzz-part--\n"  # tests/fuzz/fuzz_support.h kPartSeparator


def write(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def read(path, limit=None):
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


# ---- safetensors ----------------------------------------------------------------------------------

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_bytes(tensors, metadata=None, fill=None):
    """tensors: list of (name, dtype, shape); data are `fill` bytes repeated (or a counter)."""
    header = {}
    offset = 0
    blobs = []
    for name, dtype, shape in tensors:
        n = DTYPE_SIZE[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        if fill is not None:
            blob = (fill * (n // len(fill) + 1))[:n]
        else:
            blob = bytes((offset + i) * 37 % 251 for i in range(n))
        blobs.append(blob)
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def safetensors_header_of(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def shrunk_tensors(header, max_dim=4):
    """The tensors of a real header (names, dtypes, rank kept; every dim cut to max_dim), in offset order."""
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], [min(d, max_dim) for d in v["shape"]]) for k, v in items], header.get("__metadata__")


def seeds_safetensors(out, converted):
    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    write(out, "safetensors", "f32_2x2", safetensors_bytes([("w", "F32", [2, 2])], fill=f32))
    write(out, "safetensors", "dtypes",
          safetensors_bytes([("a", "F16", [3]), ("b", "BF16", [2, 2]), ("c", "F32", [1, 3]), ("d", "F64", [2])],
                            {"format": "pt"}))
    write(out, "safetensors", "scalar_and_empty", safetensors_bytes([("s", "F32", []), ("e", "F32", [0, 4])]))
    write(out, "safetensors", "no_tensors", safetensors_bytes([], {"note": "empty"}))
    if converted:
        tensors, metadata = shrunk_tensors(safetensors_header_of(os.path.join(converted, "model.safetensors")))
        whole = safetensors_bytes(tensors, metadata)
        write(out, "safetensors", "stories260K_shrunk", whole)
        # The sharded layout of the same model: index + 2 shards, as write_safetensors_sharded names them.
        half = len(tensors) // 2
        shards = [tensors[:half], tensors[half:]]
        names = ["model-%05d-of-%05d.safetensors" % (k + 1, len(shards)) for k in range(len(shards))]
        weight_map = {t[0]: names[k] for k, shard in enumerate(shards) for t in shard}
        index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2).encode()
        parts = [index] + [safetensors_bytes(s, metadata) for s in shards]
        write(out, "safetensors_index", "stories260K_shrunk_2shards", PART_SEPARATOR.join(parts))
    # Small hand-made sharded models (also when no converted model is given).
    a = safetensors_bytes([("x", "F32", [2])], fill=f32)
    b = safetensors_bytes([("y", "F16", [2, 1]), ("z", "BF16", [1])])
    index = json.dumps({"metadata": {"total_size": 18},
                        "weight_map": {"x": "model-00001-of-00002.safetensors",
                                       "y": "model-00002-of-00002.safetensors",
                                       "z": "model-00002-of-00002.safetensors"}}).encode()
    write(out, "safetensors_index", "two_shards", PART_SEPARATOR.join([index, a, b]))
    index1 = json.dumps({"weight_map": {"x": "model-00001-of-00001.safetensors"}}).encode()
    write(out, "safetensors_index", "one_shard", PART_SEPARATOR.join([index1, a]))


# ---- config.json ----------------------------------------------------------------------------------

def seeds_hf_config(out, converted):
    if converted:
        write(out, "hf_config", "stories260K_converted", read(os.path.join(converted, "config.json")))
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8,
             "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 512,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1,
             "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "float32"}
    write(out, "hf_config", "llama", json.dumps(llama, indent=2))
    llama3 = dict(llama, rope_theta=500000.0, eos_token_id=[128001, 128009], attention_bias=False, mlp_bias=False,
                  head_dim=16, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    write(out, "hf_config", "llama3_rope_scaling", json.dumps(llama3, indent=2))
    opt = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 64, "ffn_dim": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128,
           "word_embed_proj_dim": 32, "do_layer_norm_before": False, "enable_bias": True,
           "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
           "activation_function": "relu", "bos_token_id": 2, "eos_token_id": 2, "torch_dtype": "float16"}
    write(out, "hf_config", "opt_project_in_out", json.dumps(opt, indent=2))


# ---- tokenizers -----------------------------------------------------------------------------------

def seeds_llama2c_tokenizer(out, data):
    write(out, "llama2c_tokenizer", "tok512", read(os.path.join(data, "stories260K/tok512.bin")))
    # The first 300 tokens of the 32000-token llama2.c tokenizer.bin (cut at a token boundary).
    blob = read(os.path.join(data, "llama2c_tokenizer/tokenizer.bin"), 64 << 10)
    offset = 4
    for _ in range(300):
        (length,) = struct.unpack_from("<i", blob, offset + 4)
        offset += 8 + length
    write(out, "llama2c_tokenizer", "llama2_first300", blob[:offset])


def text_sample(data, limit=200_000):
    return read(os.path.join(data, "tinystories/tinystories_val.txt"), limit).decode("utf-8", "ignore")


def seeds_sentencepiece(out, data, tmp):
    try:
        import sentencepiece as spm
    except ImportError:
        print("fuzz_seeds: no sentencepiece module; SentencePiece seeds skipped", file=sys.stderr)
        return
    text_path = os.path.join(tmp, "spm_train.txt")
    with open(text_path, "w") as f:
        f.write(text_sample(data, 100_000))
    for name, kind, extra in [("bpe_bytefallback", "bpe", dict(byte_fallback=True)),
                              ("unigram", "unigram", {})]:
        prefix = os.path.join(tmp, name)
        spm.SentencePieceTrainer.train(input=text_path, model_prefix=prefix, vocab_size=400 if kind == "bpe" else 200,
                                       model_type=kind, character_coverage=0.995, minloglevel=2,
                                       bos_id=1, eos_id=2, unk_id=0, normalization_rule_name="identity",
                                       **extra)
        write(out, "sentencepiece", name, read(prefix + ".model"))


def seeds_tokenizer_json(out, data, tmp):
    # A slice of the real Llama-3 tokenizer.json: its normalizer/pre-tokenizer/post-processor/decoder and
    # added tokens, with the vocabulary cut to the 256 byte tokens plus the merges that stay inside it.
    path = os.path.join(data, "llama3_tokenizer/tokenizer.json")
    if os.path.exists(path):
        tok = json.loads(read(path))
        model = tok["model"]
        vocab = model["vocab"]
        keep = {k: v for k, v in vocab.items() if v < 600}
        merges = []
        for m in model["merges"]:
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            if a in keep and b in keep and a + b in keep:
                merges.append(m)
        ids = sorted(keep.values())
        remap = {old: new for new, old in enumerate(ids)}
        model["vocab"] = {k: remap[v] for k, v in keep.items()}
        model["merges"] = merges
        added = tok.get("added_tokens", [])[:4]
        for i, t in enumerate(added):
            t["id"] = len(ids) + i
        tok["added_tokens"] = added
        pp = tok.get("post_processor")
        text = json.dumps(tok, ensure_ascii=False)
        # The post-processor names <|begin_of_text|> with its old id; point it at the new one.
        if added and pp is not None:
            text = text.replace("128000", str(added[0]["id"]))
        write(out, "tokenizer_json", "llama3_slice", text)
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError:
        print("fuzz_seeds: no tokenizers module; trained tokenizer.json seeds skipped", file=sys.stderr)
        return
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([text_sample(data, 50_000)], trainer=trainer)
    write(out, "tokenizer_json", "gpt2_style", tk.to_str())
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    write(out, "tokenizer_json", "with_template_bos", tk.to_str())
    # Qwen2's layout: an NFC normalizer, its split pattern, a ByteLevel without its own regex.
    from tokenizers import Regex, normalizers
    tk.post_processor = processors.ByteLevel(trim_offsets=False)  # Qwen2's, which adds no token
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                                   r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    write(out, "tokenizer_json", "qwen2_style", tk.to_str())


def seeds_gpt2_bpe(out, data):
    vocab = json.loads(read(os.path.join(data, "gpt2_tokenizer/vocab.json")))
    merges = read(os.path.join(data, "gpt2_tokenizer/merges.txt")).decode("utf-8").split("\n")
    keep = {k: v for k, v in vocab.items() if v < 500}
    kept_merges = [merges[0]] if merges[0].startswith("#") else []
    for line in merges[1:]:
        parts = line.split(" ")
        if len(parts) == 2 and all(p in keep for p in parts) and parts[0] + parts[1] in keep:
            kept_merges.append(line)
    keep["<|endoftext|>"] = len(keep)
    seed = json.dumps(keep, ensure_ascii=False).encode() + b"\0" + ("\n".join(kept_merges) + "\n").encode()
    write(out, "gpt2_bpe", "gpt2_first500", seed)


# ---- llama2.c checkpoint ---------------------------------------------------------------------------

def llama2c_checkpoint(version, dim=8, hidden=12, layers=1, heads=2, kv_heads=1, vocab=16, seq_len=4, shared=True,
                       source=None):
    head = dim // heads
    kv_dim = head * kv_heads
    counter = [0]

    def floats(n):
        if source is not None and counter[0] + 4 * n <= len(source):
            blob = source[counter[0]:counter[0] + 4 * n]
        else:
            blob = struct.pack("<%df" % n, *[((counter[0] + i) % 17 - 8) / 16.0 for i in range(n)])
        counter[0] += 4 * n
        return blob

    def per_layer(n):
        return b"".join(floats(n) for _ in range(layers))

    if version == 0:
        out = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
        out += floats(vocab * dim) + per_layer(dim)
        out += per_layer(dim * dim) + per_layer(kv_dim * dim) + per_layer(kv_dim * dim) + per_layer(dim * dim)
        out += per_layer(dim) + per_layer(hidden * dim) + per_layer(dim * hidden) + per_layer(hidden * dim)
        out += floats(dim)
        freqs = [1.0 / (10000.0 ** (2 * i / head)) for i in range(head // 2)]
        out += struct.pack("<%df" % (seq_len * head // 2), *[math.cos(p * f) for p in range(seq_len) for f in freqs])
        out += struct.pack("<%df" % (seq_len * head // 2), *[math.sin(p * f) for p in range(seq_len) for f in freqs])
        if not shared:
            out += floats(vocab * dim)
        return out
    out = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv_heads, vocab, seq_len, 1 if shared else 0)
    out += b"\0" * (256 - len(out))
    out += per_layer(dim) + per_layer(dim) + floats(dim) + floats(vocab * dim)
    out += per_layer(dim * dim) + per_layer(kv_dim * dim) + per_layer(kv_dim * dim) + per_layer(dim * dim)
    out += per_layer(hidden * dim) + per_layer(dim * hidden) + per_layer(hidden * dim)
    if not shared:
        out += floats(vocab * dim)
    return out


def seeds_llama2c_checkpoint(out, data):
    # Real stories260K weights (from just after its header), in tiny shapes of both layouts.
    real = read(os.path.join(data, "stories260K/stories260K.bin"), 64 << 10)[28:]
    write(out, "llama2c_checkpoint", "v0_tiny_shared", llama2c_checkpoint(0, source=real))
    write(out, "llama2c_checkpoint", "v0_tiny_unshared_mha", llama2c_checkpoint(0, kv_heads=2, shared=False, source=real))
    write(out, "llama2c_checkpoint", "v1_tiny_shared", llama2c_checkpoint(1, source=real))
    write(out, "llama2c_checkpoint", "v1_tiny_unshared_2layers", llama2c_checkpoint(1, layers=2, shared=False))


# ---- calibration ---------------------------------------------------------------------------------

def prefix(nsamples_byte, seqlen_byte, seed, flags):
    """The 4-byte request prefix of tests/fuzz/calibration_fuzz_support.h."""
    return bytes([nsamples_byte, seqlen_byte, seed, flags])


def seeds_calibration(out, data):
    lines = read(os.path.join(data, "c4/c4_train00000_first1000.jsonl"), 256 << 10).split(b"\n")[:6]
    short = []
    for line in lines[:6]:
        doc = json.loads(line)
        doc["text"] = doc["text"][:400]
        short.append(json.dumps(doc).encode())
    jsonl = b"\n".join(short) + b"\n"
    write(out, "calib_jsonl", "c4_first6", prefix(3, 31, 0, 0) + jsonl)
    write(out, "calib_jsonl", "c4_first6_gz", prefix(2, 15, 7, 0) + gzip.compress(jsonl, mtime=0))
    write(out, "calib_jsonl", "c4_blank_lines_crlf", prefix(1, 3, 1, 0) + b"\r\n\n".join(short[:3]) + b"\r\n")
    text = read(os.path.join(data, "tinystories/tinystories_val.txt"), 1500)
    write(out, "calib_text", "tinystories_1500", prefix(4, 63, 0, 0) + text)
    write(out, "calib_text", "tinystories_gz", prefix(2, 7, 3, 0) + gzip.compress(text, mtime=0))
    wiki = read(os.path.join(data, "wikitext2/wiki.test.nonempty_rows.crlf.raw"), 800)
    write(out, "calib_text", "wikitext_crlf", prefix(1, 20, 0, 2) + wiki)
    ids = [1] + [b + 3 for b in text[:300]]
    write(out, "calib_tokens", "u16_tinystories", prefix(3, 15, 0, 2 << 1) + struct.pack("<%dH" % len(ids), *ids))
    write(out, "calib_tokens", "u32_tinystories", prefix(3, 15, 0, 1 | (4 << 1)) + struct.pack("<%dI" % len(ids), *ids))


# ---- recipes -------------------------------------------------------------------------------------

def seeds_recipes(out):
    write(out, "recipe_toml", "wanda50", '# wanda50.toml\nmodel = "llama2-7b"\nmethod = "wanda"\nsparsity = 0.5\n'
          'nsamples = 128\nseqlen = 2048\nseed = 0\nforce = true\n')
    write(out, "recipe_toml", "lists_and_escapes",
          "model = 'models/x'\nskip = [\n  \"mlp\", # comment\n  'attn',\n]\ncompat = \"w\\tanda\\n\"\nnm = \"2:4\"\n"
          "nsamples = 1_024\nalpha = -1.5e-3\n")
    write(out, "recipe_yaml", "wanda50", "---\n# wanda50.yaml\nmodel: llama2-7b\nmethod: wanda\nsparsity: 0.5\n"
          "nsamples: 128\nseqlen: 2048\nforce: true\n")
    write(out, "recipe_yaml", "lists", "model: \"models/x\"\nskip: [mlp, attn]\nnm: '2:4'\nseed: 3\n"
          "compat:\n  - ria\n")


def seeds_torch_checkpoint(out, tmp):
    """What torch.save writes (when this Python has torch): a state dict with fp32/fp16/bf16 tensors, a
    transposed view, an offset view and a tied pair sharing one storage; the bare data.pkl too."""
    try:
        import torch
    except ImportError:
        return
    import zipfile
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"w": base, "t": base.t(), "row": base[1], "tied": base, "h": torch.ones(2, 3, dtype=torch.float16),
             "b": torch.zeros(5, dtype=torch.bfloat16)}
    path = os.path.join(tmp, "pytorch_model.bin")
    torch.save(state, path)
    write(out, "torch_checkpoint", "torch_save_views", read(path))
    with zipfile.ZipFile(path) as archive:
        pickle = next(name for name in archive.namelist() if name.endswith("/data.pkl"))
        write(out, "torch_checkpoint", "torch_save_data_pkl", archive.read(pickle))


def seeds_unicode_nfc(out, data):
    """Text NFC reworks: decomposed accents, marks out of order, singletons, Hangul jamo, and marks newer
    than the tokenizers package's tables; a slice of TinyStories as it is, and decomposed (NFD)."""
    import unicodedata
    write(out, "unicode_nfc", "marks", "Cafe\u0301 C\u0301\u0327 a\u0302\u0323 \u212b\u2126\uf900 \u0958 "
          "\u1100\u1161\u11a8 \uac00\u11a8 a\u0898\u0334 \U00011935\U00011930 \U0001d15e".encode())
    text = text_sample(data, 600)
    write(out, "unicode_nfc", "tinystories", text.encode())
    write(out, "unicode_nfc", "tinystories_nfd", unicodedata.normalize("NFD", text).encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--converted", help="stories260K converted by symprune convert-llama2c")
    args = parser.parse_args()
    tmp = os.path.join(args.out, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    seeds_safetensors(args.out, args.converted)
    seeds_hf_config(args.out, args.converted)
    seeds_llama2c_tokenizer(args.out, args.data)
    seeds_sentencepiece(args.out, args.data, tmp)
    seeds_tokenizer_json(args.out, args.data, tmp)
    seeds_gpt2_bpe(args.out, args.data)
    seeds_llama2c_checkpoint(args.out, args.data)
    seeds_calibration(args.out, args.data)
    seeds_recipes(args.out)
    seeds_torch_checkpoint(args.out, tmp)
    seeds_unicode_nfc(args.out, args.data)
    for name in sorted(os.listdir(tmp)):
        os.remove(os.path.join(tmp, name))
    os.rmdir(tmp)
    for target in sorted(os.listdir(args.out)):
        files = os.listdir(os.path.join(args.out, target))
        print("fuzz_seeds: %-20s %d seeds" % (target, len(files)))


if __name__ == "__main__":
    main()
