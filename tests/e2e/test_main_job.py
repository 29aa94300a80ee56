"""The README's main job on the bundled model: stories260K (llama2.c) converted to a Hugging Face
directory, perplexity on the second half of TinyStories validation (split at the line boundary
nearest the middle) at seqlen 256. symprune's figure must equal transformers' on the converted model
with the same protocol (token ids from symprune's llama2.c tokenizer, which has its own parity test)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaForCausalLM

BIN = os.environ["SYMPRUNE_BIN"]
DATA = Path(os.environ["SYMPRUNE_DATA"])
SOURCE = Path(os.environ["SYMPRUNE_SOURCE_DIR"])
SEQLEN = 256
CHUNKS = 24  # a prefix of the evaluation keeps the transformers side fast; symprune runs all of it too


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=True)


def test_stories260k_perplexity_matches_transformers(tmp_path):
    subprocess.run([sys.executable, SOURCE / "scripts" / "split_text.py", DATA / "tinystories" / "tinystories_val.txt",
                    tmp_path / "first.txt", tmp_path / "second.txt"], check=True, capture_output=True)
    first = (tmp_path / "first.txt").read_bytes()
    whole = (DATA / "tinystories" / "tinystories_val.txt").read_bytes()
    assert first.endswith(b"\n") and whole == first + (tmp_path / "second.txt").read_bytes()
    assert abs(len(first) - len(whole) / 2) < 2000

    model_dir = tmp_path / "stories260K-hf"
    run("convert-llama2c", "--checkpoint", DATA / "stories260K" / "stories260K.bin", "--tokenizer",
        DATA / "stories260K" / "tok512.bin", "--out", model_dir)
    report = tmp_path / "eval.json"
    out = run("eval", "--model", model_dir, "--text", tmp_path / "second.txt", "--seqlen", SEQLEN,
              "--report", report, "--max-chunks", CHUNKS)
    result = json.loads(report.read_text())
    assert result["seqlen"] == SEQLEN and result["chunks"] == CHUNKS
    assert f"perplexity: {result['perplexity']:.6f}" in out.stdout

    ids = [int(x) for x in run("tokenize", "--tokenizer", model_dir, "--text-file", tmp_path / "second.txt")
           .stdout.strip().split(",")]
    assert ids[0] == 1 and ids.count(1) == 1  # one BOS, at the start of the whole text
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    losses = []
    with torch.no_grad():
        for i in range(CHUNKS):
            chunk = torch.tensor([ids[i * SEQLEN:(i + 1) * SEQLEN]])
            logits = model(chunk).logits[0].double()
            losses.append(torch.nn.functional.cross_entropy(logits[:-1], chunk[0, 1:]).item())
    expected = float(np.exp(np.mean(losses)))
    assert abs(result["perplexity"] - expected) <= 1e-5 * expected, (result["perplexity"], expected)
    np.testing.assert_allclose(result["chunk_nll"], losses, rtol=1e-5)
    # A trained model: far below uniform (512) and in the range the model card reports for TinyStories.
    assert 3.0 < result["perplexity"] < 10.0
