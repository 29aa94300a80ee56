"""`symprune eval` on tiny random models equals the papers' perplexity protocol computed here with
transformers (one BOS at the start of the text, non-overlapping chunks of T tokens, tail dropped,
PPL = exp(mean over chunks of the mean next-token NLL)), plus the bad-input errors."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

BIN = os.environ.get("SYMPRUNE_BIN", "symprune")
DATA = Path(os.environ.get("SYMPRUNE_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
GPT2 = DATA / "gpt2_tokenizer"
WIKI = DATA / "wikitext2" / "wiki.test.hf_rows_joined_nn.txt"
VOCAB = 50272  # OPT's padded GPT-2 vocabulary
BOS = 50256    # <|endoftext|>, chosen through tokenizer_config.json
SEQLEN = 128
MAX_POS = 256


def make_model(family, out_dir):
    torch.manual_seed(11)
    if family == "opt":
        cfg = OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
                        max_position_embeddings=MAX_POS, word_embed_proj_dim=32, init_std=0.2, bos_token_id=2,
                        eos_token_id=2, pad_token_id=1)
        model = OPTForCausalLM(cfg)
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POS,
                          initializer_range=0.2, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    model = model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def add_tokenizer(model_dir):
    shutil.copy(GPT2 / "vocab.json", model_dir / "vocab.json")
    shutil.copy(GPT2 / "merges.txt", model_dir / "merges.txt")
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "add_bos_token": True}))


def reference_ppl(model, ids, seqlen, max_chunks=None):
    n_chunks = len(ids) // seqlen
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    losses = []
    with torch.no_grad():
        for i in range(n_chunks):
            chunk = torch.tensor([ids[i * seqlen:(i + 1) * seqlen]])
            logits = model(chunk).logits[0].double()
            loss = torch.nn.functional.cross_entropy(logits[:-1], chunk[0, 1:])
            losses.append(loss.item())
    return float(np.exp(np.mean(losses))), n_chunks, losses


def run(args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "wiki_head.txt"
    path.write_text(WIKI.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    return path


@pytest.mark.parametrize("family", ["opt", "llama"])
def test_eval_matches_python_protocol(family, text_file, tmp_path):
    model_dir = tmp_path / "model"
    model = make_model(family, model_dir)
    add_tokenizer(model_dir)
    tok = GPT2TokenizerFast(vocab_file=str(GPT2 / "vocab.json"), merges_file=str(GPT2 / "merges.txt"))
    ids = [BOS] + tok.encode(text_file.read_text(encoding="utf-8"))
    want, n_chunks, losses = reference_ppl(model, ids, SEQLEN)
    assert n_chunks >= 10 and len(ids) % SEQLEN != 0  # a real tail is dropped

    report = tmp_path / "report.json"
    proc = run(["eval", "--model", model_dir, "--text", text_file, "--seqlen", SEQLEN, "--report", report,
                "--batch", 3])
    assert proc.returncode == 0, proc.stderr
    line = [l for l in proc.stdout.splitlines() if l.startswith("perplexity: ")]
    assert len(line) == 1
    got = float(line[0].split(": ")[1])
    assert abs(got - want) <= 1e-4 * want, (got, want)
    assert "chunks" in proc.stderr + proc.stdout  # progress / summary

    r = json.loads(report.read_text())
    assert abs(r["perplexity"] - want) <= 1e-4 * want
    assert r["chunks"] == n_chunks
    assert r["tokens"] == len(ids)
    assert r["evaluated_tokens"] == n_chunks * SEQLEN
    assert r["seqlen"] == SEQLEN
    assert r["bos_id"] == BOS
    assert len(r["model_fingerprint"]) == 16
    assert r["wall_seconds"] > 0
    assert np.allclose(r["chunk_nll"], losses, atol=1e-4)
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]

    # --max-chunks evaluates the first K chunks only.
    want2, _, _ = reference_ppl(model, ids, SEQLEN, max_chunks=2)
    proc = run(["eval", "--model", model_dir, "--text", text_file, "--seqlen", SEQLEN, "--max-chunks", 2])
    assert proc.returncode == 0, proc.stderr
    got2 = float([l for l in proc.stdout.splitlines() if l.startswith("perplexity: ")][0].split(": ")[1])
    assert abs(got2 - want2) <= 1e-4 * want2


def test_eval_errors(tmp_path):
    model_dir = tmp_path / "model"
    make_model("opt", model_dir)
    short = tmp_path / "short.txt"
    short.write_text("Hello world, this is short.")
    report = tmp_path / "report.json"

    # No tokenizer in the model directory.
    proc = run(["eval", "--model", model_dir, "--text", short, "--seqlen", SEQLEN, "--report", report])
    assert proc.returncode == 1
    assert f"symprune: error: no tokenizer found in directory {model_dir}" in proc.stderr

    add_tokenizer(model_dir)
    tok = GPT2TokenizerFast(vocab_file=str(GPT2 / "vocab.json"), merges_file=str(GPT2 / "merges.txt"))
    n = 1 + len(tok.encode(short.read_text()))
    proc = run(["eval", "--model", model_dir, "--text", short, "--seqlen", SEQLEN, "--report", report])
    assert proc.returncode == 1
    assert f"symprune: error: {short}: {n} tokens, fewer than one chunk of {SEQLEN}" in proc.stderr

    proc = run(["eval", "--model", model_dir, "--text", short, "--seqlen", MAX_POS + 1, "--report", report])
    assert proc.returncode == 1
    assert (f"symprune: error: --seqlen {MAX_POS + 1} exceeds max_position_embeddings {MAX_POS} of "
            f"{model_dir / 'config.json'}") in proc.stderr

    proc = run(["eval", "--model", model_dir, "--text", tmp_path / "absent.txt", "--seqlen", SEQLEN])
    assert proc.returncode == 1
    assert f"symprune: error: {tmp_path / 'absent.txt'}: text file (--text) not found" in proc.stderr
    assert not report.exists()


def test_eval_of_a_synthetic_model_and_bad_counts(text_file, tmp_path):
    # README: synthetic models work with eval given --tokenizer (tiny-llama has tok512's 512 ids).
    tokenizer = DATA / "stories260K" / "tok512.bin"
    report = tmp_path / "report.json"
    common = ["--text", text_file, "--seqlen", 64]
    proc = run(["eval", "--model", "synthetic:tiny-llama", "--tokenizer", tokenizer, *common, "--max-chunks", 2,
                "--report", report])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(report.read_text())
    assert result["model"] == result["model_fingerprint"] == "synthetic:tiny-llama:0"
    assert result["chunks"] == 2 and np.isfinite(result["perplexity"]) and result["perplexity"] > 1
    assert result["symprune"]["tool"] == "symprune" and result["symprune"]["version"]  # as prune reports
    # logits of a synthetic model: [T, vocab] fp32, the same for the same seed, others for another seed.
    logits = []
    for spec in ["synthetic:tiny-llama", "synthetic:tiny-llama", "synthetic:tiny-llama:7"]:
        out = tmp_path / f"logits{len(logits)}.f32"
        proc = run(["logits", "--model", spec, "--ids", "1,2,3", "--out", out])
        assert proc.returncode == 0, proc.stderr
        logits.append(np.fromfile(out, dtype="<f4").reshape(3, 512))
    assert np.isfinite(logits[0]).all() and np.array_equal(logits[0], logits[1])
    assert not np.allclose(logits[0], logits[2])
    proc = run(["eval", "--model", "synthetic:tiny-llama", *common])
    assert proc.returncode == 1
    assert "synthetic:tiny-llama has no tokenizer: give one with --tokenizer" in proc.stderr
    # Counts that cannot be negative are refused, as prune refuses them.
    for option, value, message in [("--max-chunks", -5, "--max-chunks must be >= 0 (0 = all), got -5"),
                                   ("--batch", -3, "--batch must be >= 0 (0 = automatic), got -3")]:
        proc = run(["eval", "--model", "synthetic:tiny-llama", "--tokenizer", tokenizer, *common, option, value])
        assert proc.returncode == 1 and f"symprune: error: {message}" in proc.stderr, proc.stderr
    proc = run(["calib", "--calib", text_file, "--tokenizer", tokenizer, "--nsamples", 1, "--seqlen", 8,
                "--vocab-size", -5])
    assert proc.returncode == 1
    assert "symprune: error: --vocab-size must be >= 0 (0: the tokenizer's), got -5" in proc.stderr
