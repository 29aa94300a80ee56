"""symprune convert-llama2c: stories260K (llama2.c v0) -> Hugging Face LLaMA directory.

The converted model must reproduce the logits that karpathy's run.c printed for the prompt
"Once upon a time, there was a little girl named Lily." (reference/logits_once_upon_a_time_lily.f32)
under transformers, under a plain numpy llama2.c forward of the *unconverted* weights (interleaved
RoPE, which checks the q/k row permutation independently), and under `symprune logits`.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

BIN = os.environ["SYMPRUNE_BIN"]
DATA = pathlib.Path(os.environ["SYMPRUNE_DATA"])
CHECKPOINT = DATA / "stories260K" / "stories260K.bin"
TOKENIZER = DATA / "stories260K" / "tok512.bin"
REFERENCE = DATA / "stories260K" / "reference" / "logits_once_upon_a_time_lily.f32"
IDS = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426]
TOLERANCE = 1e-4  # max |logits - reference| / max |reference|
SOURCE = pathlib.Path(os.environ["SYMPRUNE_SOURCE_DIR"])


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)


def convert(out, checkpoint=CHECKPOINT, tokenizer=TOKENIZER, *extra):
    return run("convert-llama2c", "--checkpoint", checkpoint, "--tokenizer", tokenizer, "--out", out, *extra)


def reference_logits():
    ref = np.fromfile(REFERENCE, dtype="<f4")
    assert ref.size == 16 * 512
    return ref.reshape(16, 512).astype(np.float64)


def relative_error(logits, ref):
    return float(np.abs(np.asarray(logits, dtype=np.float64) - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "stories260K"
    result = convert(out)
    assert result.returncode == 0, result.stderr
    assert "dim 64" in result.stdout and "tied embeddings" in result.stdout
    return out


def read_llama2c(path):
    """Independent parser of the legacy v0 layout (numpy only)."""
    header = np.fromfile(path, dtype="<i4", count=7)
    dim, hidden, layers, heads, kv_heads, vocab, seq = (int(v) for v in header)
    shared = vocab > 0
    vocab = abs(vocab)
    floats = np.fromfile(path, dtype="<f4", offset=28).astype(np.float64)
    head = dim // heads
    kv = head * kv_heads
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = floats[at:at + n].reshape(shape)
        at += n
        return out

    w = {"emb": take(vocab, dim), "rms_att": take(layers, dim), "wq": take(layers, dim, dim),
         "wk": take(layers, kv, dim), "wv": take(layers, kv, dim), "wo": take(layers, dim, dim),
         "rms_ffn": take(layers, dim), "w1": take(layers, hidden, dim), "w2": take(layers, dim, hidden),
         "w3": take(layers, hidden, dim), "rms_final": take(dim)}
    take(seq, head // 2)
    take(seq, head // 2)
    w["cls"] = w["emb"] if shared else take(vocab, dim)
    assert at == floats.size
    return w, dict(dim=dim, layers=layers, heads=heads, kv_heads=kv_heads, head=head)


def llama2c_forward(w, p, ids):
    """run.c's forward pass over all positions at once: interleaved RoPE pairs (2i, 2i+1)."""
    def rmsnorm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g

    def rope(x, n_heads):  # x [T, n_heads * head]
        t = x.shape[0]
        x = x.reshape(t, n_heads, p["head"] // 2, 2)
        freq = 10000.0 ** (-np.arange(0, p["head"], 2) / p["head"])
        angle = np.arange(t)[:, None] * freq[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., 0], x[..., 1]
        return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(t, -1)

    t = len(ids)
    x = w["emb"][ids]
    group = p["heads"] // p["kv_heads"]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for l in range(p["layers"]):
        xb = rmsnorm(x, w["rms_att"][l])
        q = rope(xb @ w["wq"][l].T, p["heads"]).reshape(t, p["heads"], p["head"])
        k = rope(xb @ w["wk"][l].T, p["kv_heads"]).reshape(t, p["kv_heads"], p["head"])
        v = (xb @ w["wv"][l].T).reshape(t, p["kv_heads"], p["head"])
        out = np.empty((t, p["heads"], p["head"]))
        for h in range(p["heads"]):
            scores = q[:, h] @ k[:, h // group].T / np.sqrt(p["head"]) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, h] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, h // group]
        x = x + out.reshape(t, -1) @ w["wo"][l].T
        xb = rmsnorm(x, w["rms_ffn"][l])
        gate = xb @ w["w1"][l].T
        x = x + ((gate / (1 + np.exp(-gate))) * (xb @ w["w3"][l].T)) @ w["w2"][l].T
    return rmsnorm(x, w["rms_final"]) @ w["cls"].T


def test_output_directory_contents(model_dir):
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json", "model.safetensors", "symprune_provenance.json", "tokenizer.bin", "tokenizer.json",
        "tokenizer_config.json"]
    provenance = json.loads((model_dir / "symprune_provenance.json").read_text())
    assert provenance["tool"] == "symprune" and provenance["command"] == "convert-llama2c"
    assert provenance["checkpoint"] == str(CHECKPOINT) and provenance["version"] and provenance["commit"]
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "LlamaTokenizerFast"
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == ("<s>", "</s>")
    assert tokenizer_config["add_bos_token"] is True
    assert "tokenizer_file" not in tokenizer_config  # transformers would take it as tokenizer.json's path
    assert not [p for p in model_dir.parent.iterdir() if p.name != model_dir.name]  # no temp dirs left
    config = json.loads((model_dir / "config.json").read_text())
    expected = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=172,
                    num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
                    max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                    attention_bias=False)
    for key, value in expected.items():
        assert config[key] == value, key
    assert (model_dir / "tokenizer.bin").read_bytes() == TOKENIZER.read_bytes()
    from safetensors import safe_open
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        assert "lm_head.weight" not in names and len(names) == 2 + 5 * 9
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").dtype == np.float32


def test_numpy_llama2c_forward_matches_reference():
    w, p = read_llama2c(CHECKPOINT)
    logits = llama2c_forward(w, p, IDS)
    assert relative_error(logits, reference_logits()) < TOLERANCE
    assert list(logits.argmax(axis=-1)[:-1]) == IDS[1:]


def test_transformers_logits_match_reference(model_dir):
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0].double().numpy()
    ref = reference_logits()
    assert relative_error(logits, ref) < TOLERANCE
    # And the same weights through numpy with the original (unpermuted) rows.
    w, p = read_llama2c(CHECKPOINT)
    assert relative_error(logits, llama2c_forward(w, p, IDS)) < TOLERANCE


def test_symprune_logits_match_reference(model_dir, tmp_path):
    if " logits " not in run("--help").stdout:
        pytest.skip("symprune has no logits subcommand")
    out = tmp_path / "logits.f32"
    result = run("logits", "--model", model_dir, "--ids", ",".join(map(str, IDS)), "--out", out)
    assert result.returncode == 0, result.stderr
    logits = np.fromfile(out, dtype="<f4")
    assert logits.size == 16 * 512
    assert relative_error(logits.reshape(16, 512), reference_logits()) < TOLERANCE


def test_truncated_checkpoint_is_refused(tmp_path):
    cut = tmp_path / "cut.bin"
    cut.write_bytes(CHECKPOINT.read_bytes()[:100000])
    out = tmp_path / "out"
    result = convert(out, cut)
    assert result.returncode == 1
    assert "symprune: error:" in result.stderr
    assert str(cut) in result.stderr and "has 100000 bytes" in result.stderr
    assert "implies 1056540 bytes (truncated?)" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.bin"]


def test_missing_tokenizer_is_refused(tmp_path):
    out = tmp_path / "out"
    result = convert(out, CHECKPOINT, tmp_path / "no_tokenizer.bin")
    assert result.returncode == 1
    assert "cannot open tokenizer" in result.stderr and "no_tokenizer.bin" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_non_empty_output_is_refused_unless_forced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = convert(out)
    assert result.returncode == 1
    assert "exists and is not empty (use --force to replace it)" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    # --force replaces only what symprune wrote: never a directory of the user's.
    result = convert(out, CHECKPOINT, TOKENIZER, "--force")
    assert result.returncode == 1
    assert "was not written by symprune" in result.stderr
    assert (out / "notes.txt").read_text() == "keep me"

    converted = tmp_path / "converted"
    assert convert(converted).returncode == 0
    (converted / "extra.txt").write_text("stale")
    result = convert(converted, CHECKPOINT, TOKENIZER, "--force")
    assert result.returncode == 0, result.stderr
    assert not (converted / "extra.txt").exists() and (converted / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted", "out"]


# --- Hugging Face tools on the converted and the pruned model -------------------------------------

def sample_texts():
    """TinyStories paragraphs, C4 documents, unicode, emoji (byte fallback) and whitespace runs."""
    stories = (DATA / "tinystories" / "tinystories_val.txt").read_text(encoding="utf-8").split("\n\n")[:150]
    with open(DATA / "c4" / "c4_train00000_first1000.jsonl", encoding="utf-8") as f:
        c4 = [json.loads(next(f))["text"] for _ in range(30)]
    return stories + c4 + [
        "", " ", "x", "Once upon a time, there was a little girl named Lily.", "Zoo",
        "caf\u00e9 na\u00efve \u00fcber \u00e5ngstr\u00f6m", "\u4f60\u597d\uff0c\u4e16\u754c \u65e5\u672c\u8a9e",
        "emoji \U0001F600\U0001F389\U0001F916 \u2764\ufe0f and \U0001F1FA\U0001F1F8 flags",
        "  two  spaces  ", "tabs\t\tand\nnew\n\nlines\r\n", "         nine spaces", "trailing   ",
        "\u2211 \u221a \u222b math, \u00a0non-breaking\u00a0space", "Spot. Spot saw the shiny car. " * 20]


def symprune_ids(tokenizer_dir, texts, tmp_path):
    batch = tmp_path / "texts.json"
    batch.write_text(json.dumps(texts))
    result = run("tokenize", "--tokenizer", tokenizer_dir, "--texts-json", batch)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def check_hf_tokenizer(directory, tmp_path):
    """AutoTokenizer on `directory` gives symprune's ids (which are llama2.c run.c's) for every text."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    texts = sample_texts()
    ours = symprune_ids(directory, texts, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert type(tokenizer).__name__ == "LlamaTokenizerFast"
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (1, 2, 0)
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    for text, ids in zip(texts, ours):
        assert tokenizer(text)["input_ids"] == ids, text[:80]
        assert raw.encode(text).ids == ids, text[:80]
    # Decoding gives the text back (byte fallback included).
    for text in texts[-8:]:
        if text.strip() == text and "\u00a0" not in text:
            assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    return tokenizer


def test_transformers_tokenizer_matches_symprune(model_dir, tmp_path):
    tokenizer = check_hf_tokenizer(model_dir, tmp_path)
    assert tokenizer("Once upon a time, there was a little girl named Lily.")["input_ids"] == IDS


def test_quickstart_output_works_with_transformers(model_dir, tmp_path):
    """The quickstart's wanda-50 % model (fewer calibration windows) loads with AutoTokenizer and
    AutoModelForCausalLM, tokenizes like symprune and generates."""
    import subprocess as sp
    import sys
    first, second = tmp_path / "first_half.txt", tmp_path / "second_half.txt"
    sp.run([sys.executable, SOURCE / "scripts" / "split_text.py", DATA / "tinystories" / "tinystories_val.txt",
            first, second], check=True, capture_output=True)
    pruned = tmp_path / "stories260K-wanda50"
    result = run("prune", "--model", model_dir, "--method", "wanda", "--sparsity", "0.5", "--calib", first,
                 "--nsamples", "16", "--seqlen", "256", "--eval", second, "--eval-max-chunks", "4", "--out", pruned)
    assert result.returncode == 0, result.stderr
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.bin"):
        assert (pruned / name).read_bytes() == (model_dir / name).read_bytes(), name
    tokenizer = check_hf_tokenizer(pruned, tmp_path)

    import torch
    from transformers import AutoModelForCausalLM, pipeline
    model = AutoModelForCausalLM.from_pretrained(str(pruned), torch_dtype=torch.float32)
    assert (model.model.layers[0].mlp.up_proj.weight == 0).float().mean().item() == pytest.approx(0.5, abs=0.01)
    inputs = tokenizer("Once upon a time", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 20
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    assert text.startswith("Once upon a time") and len(text) > len("Once upon a time") + 20
    generated = pipeline("text-generation", model=str(pruned), tokenizer=str(pruned))(
        "Lily went to the park", max_new_tokens=10, do_sample=False)
    assert generated[0]["generated_text"].startswith("Lily went to the park")
