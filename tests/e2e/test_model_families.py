"""The LLaMA architecture's other model types, end to end with transformers as the reference.

Qwen2 (biases on q/k/v, a byte-level tokenizer.json with an NFC normalizer and no BOS): `symprune eval`
and a prune's dense and pruned perplexities equal transformers' on the same chunks, and the pruned copy
loads in transformers with exactly the masked weights zeroed and its biases unchanged.
Mistral (a sliding window): sequences up to the window run, longer ones are refused before anything is
read or written, and --compat wanda's default window length is the sliding window."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

BIN = os.environ.get("SYMPRUNE_BIN", "symprune")
DATA = Path(os.environ.get("SYMPRUNE_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
WIKI = DATA / "wikitext2" / "wiki.test.hf_rows_joined_nn.txt"
LLAMA2_TOKENIZER = DATA / "llama2c_tokenizer" / "tokenizer.model"
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

# Qwen2's split pattern (Qwen/Qwen2.5-7B tokenizer.json).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)


def qwen2_tokenizer(model_dir):
    """Qwen2's tokenizer.json layout (NFC, split, ByteLevel without its regex, specials) over a vocabulary
    of the 256 byte tokens, with merges of frequent pairs trained on WikiText so that it merges for real."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=QWEN2_SPECIALS, show_progress=False)
    tok.train_from_iterator([WIKI.read_text(encoding="utf-8")[:200_000]], trainer=trainer)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|endoftext|>", "add_prefix_space": False}))
    return tok


def make_qwen2(model_dir):
    model_dir.mkdir()
    tok = qwen2_tokenizer(model_dir)
    torch.manual_seed(21)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=512, rope_theta=1000000.0, initializer_range=0.1,
                         tie_word_embeddings=False, eos_token_id=tok.token_to_id("<|endoftext|>"))
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(model_dir, safe_serialization=True)
    return model, tok


def reference_ppl(model, ids, seqlen, max_chunks):
    n_chunks = min(len(ids) // seqlen, max_chunks)
    losses = []
    with torch.no_grad():
        for i in range(n_chunks):
            chunk = torch.tensor([ids[i * seqlen:(i + 1) * seqlen]])
            logits = model(chunk).logits[0].double()
            losses.append(torch.nn.functional.cross_entropy(logits[:-1], chunk[0, 1:]).item())
    return float(np.exp(np.mean(losses)))


def test_qwen2_eval_and_prune_match_transformers(tmp_path):
    model_dir = tmp_path / "qwen2"
    model, tok = make_qwen2(model_dir)
    text = tmp_path / "wiki.txt"
    # Decomposed accents too, which the NFC normalizer composes before the split.
    text.write_text(WIKI.read_text(encoding="utf-8")[:30_000] + " Cafe\u0301 re\u0301sume\u0301", encoding="utf-8")
    ids = tok.encode(text.read_text(encoding="utf-8")).ids  # Qwen2 adds no BOS
    assert len(ids) > 8 * 128 and tok.get_vocab_size() == 400
    dense_want = reference_ppl(model, ids, 128, 6)
    proc = run("inspect", "--model", model_dir)
    assert proc.returncode == 0, proc.stderr
    assert "family: LLaMA (qwen2)" in proc.stdout
    assert "biases: q/k/v, attention: full causal" in proc.stdout

    proc = run("eval", "--model", model_dir, "--text", text, "--seqlen", 128, "--max-chunks", 6,
               "--report", tmp_path / "eval.json")
    assert proc.returncode == 0, proc.stderr
    assert "has no BOS token; the text is evaluated without one" in proc.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["tokens"] == len(ids)
    assert abs(report["perplexity"] - dense_want) <= 1e-4 * dense_want

    out = tmp_path / "pruned"
    proc = run("prune", "--model", model_dir, "--method", "wanda", "--sparsity", 0.5, "--calib", text,
               "--nsamples", 8, "--seqlen", 64, "--eval", text, "--eval-seqlen", 128, "--eval-max-chunks", 6,
               "--out", out, "--report", tmp_path / "prune.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "prune.json").read_text())
    assert abs(report["perplexity"]["dense"] - dense_want) <= 1e-4 * dense_want

    pruned = Qwen2ForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    pruned_want = reference_ppl(pruned, ids, 128, 6)
    assert abs(report["perplexity"]["pruned"] - pruned_want) <= 1e-4 * pruned_want
    assert pruned_want > dense_want
    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after)
    linears = [n for n in after if n.endswith("_proj.weight")]
    assert len(linears) == 2 * 7
    for name in linears:
        w = after[name]
        assert ((w == 0).sum(dim=1) == w.shape[1] // 2).all(), name  # exactly half of every row
        kept = w != 0
        assert torch.equal(w[kept], before[name][kept]), name
    biases = [n for n in after if n.endswith(".bias")]
    assert sorted({n.split(".")[-2] for n in biases}) == ["k_proj", "q_proj", "v_proj"]
    for name in biases:
        assert torch.equal(after[name], before[name]), name
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    assert (out / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def make_mistral(model_dir, window):
    torch.manual_seed(22)
    config = MistralConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           sliding_window=window, initializer_range=0.1)
    MistralForCausalLM(config).eval().save_pretrained(model_dir, safe_serialization=True)
    shutil.copy(LLAMA2_TOKENIZER, model_dir / "tokenizer.model")


def test_mistral_sliding_window_bounds_the_sequence_length(tmp_path):
    model_dir = tmp_path / "mistral"
    make_mistral(model_dir, window=64)
    text = tmp_path / "wiki.txt"
    text.write_text(WIKI.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    config_json = model_dir / "config.json"

    proc = run("inspect", "--model", model_dir)
    assert proc.returncode == 0, proc.stderr
    assert "family: LLaMA (mistral)" in proc.stdout
    assert "biases: none, attention: sliding window of 64 (longer sequences are refused)" in proc.stdout

    out = tmp_path / "pruned"
    common = ["prune", "--model", model_dir, "--method", "wanda", "--sparsity", 0.5, "--calib", text,
              "--nsamples", 4, "--out", out, "--report", tmp_path / "r.json"]
    proc = run(*common, "--seqlen", 65)
    assert proc.returncode == 1
    assert f"symprune: error: --seqlen 65 exceeds sliding_window 64 of {config_json}" in proc.stderr
    proc = run(*common, "--seqlen", 64, "--eval", text, "--eval-seqlen", 128)
    assert proc.returncode == 1
    assert f"--eval-seqlen 128 exceeds sliding_window 64 of {config_json}: pass --eval-seqlen 64" in proc.stderr
    assert not out.exists() and not (tmp_path / "r.json").exists()
    proc = run("eval", "--model", model_dir, "--text", text, "--seqlen", 65)
    assert proc.returncode == 1
    assert f"--seqlen 65 exceeds sliding_window 64 of {config_json}" in proc.stderr

    # Up to the window the prune runs; --compat wanda's window length is the model's longest, the window.
    proc = run(*common, "--compat", "wanda", "--eval", text, "--eval-max-chunks", 2)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["perplexity"]["seqlen"] == 64
    assert report["sparsity"]["total"] == pytest.approx(0.5)
    assert MistralForCausalLM.from_pretrained(out).config.sliding_window == 64
