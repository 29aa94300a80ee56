"""`symprune calib` against the reference calibration samplers, written here in Python.

JSONL: the C4 loop of Wanda/RIA/DSnoT/SparseGPT (reference-implementations.md §1.2) with Python's
`random` and the LLaMA-2 tokenizer (transformers' slow LlamaTokenizer on tokenizer.model, as those
tools tokenize), on the shared C4 sample: the chosen (document, start) pairs and the window tokens must
be identical. Text and token files: `random.seed(S); [random.randint(0, L-T-1) for _ in range(N)]`.
"""
import gzip
import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

DATA = Path(os.environ["SYMPRUNE_DATA"])
BIN = os.environ["SYMPRUNE_BIN"]
TOKENIZER = DATA / "llama2c_tokenizer" / "tokenizer.model"
C4 = DATA / "c4" / "c4_train00000_first1000.jsonl"
TINYSTORIES = DATA / "tinystories" / "tinystories_val.txt"
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def llama_tokenizer():
    from transformers import LlamaTokenizer

    # legacy=True is what transformers 4.28-4.36 (pinned by the reference tools) do by default.
    return LlamaTokenizer(vocab_file=str(TOKENIZER), legacy=True)


@pytest.fixture(scope="module")
def c4_docs():
    with open(C4, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def reference_c4(docs, encode, nsamples, seqlen, seed):
    """The reference loop. Caching tokenizations does not change the random stream."""
    cache = {}
    random.seed(seed)
    windows, tokens = [], []
    for _ in range(nsamples):
        while True:
            i = random.randint(0, len(docs) - 1)
            if i not in cache:
                cache[i] = encode(docs[i])
            ids = cache[i]
            if len(ids) > seqlen:
                break
        start = random.randint(0, len(ids) - seqlen - 1)
        windows.append((i, start))
        tokens.extend(ids[start:start + seqlen])
    return windows, tokens


def fingerprint(tokens):
    h = 0xCBF29CE484222325
    for b in np.asarray(tokens, dtype="<i4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_calib(calib, tmp_path, nsamples, seqlen, seed, *extra):
    out = tmp_path / f"tokens_{nsamples}_{seqlen}_{seed}.bin"
    cmd = [BIN, "calib", "--tokenizer", str(TOKENIZER), "--calib", str(calib), "--nsamples", str(nsamples),
           "--seqlen", str(seqlen), "--seed", str(seed), "--json", "--out", str(out), *extra]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    tokens = np.fromfile(out, dtype="<u4")
    assert tokens.size == nsamples * seqlen
    return info, tokens


@pytest.mark.parametrize("nsamples,seqlen,seed", [(16, 256, 0), (16, 256, 3), (128, 2048, 0)])
def test_c4_windows_equal_reference_loop(tmp_path, c4_docs, llama_tokenizer, nsamples, seqlen, seed):
    ref_windows, ref_tokens = reference_c4(c4_docs, lambda t: llama_tokenizer(t)["input_ids"], nsamples,
                                           seqlen, seed)
    info, tokens = run_calib(C4, tmp_path, nsamples, seqlen, seed)
    assert info["format"] == "jsonl"
    assert info["documents"] == 1000
    assert [(w["doc"], w["start"]) for w in info["windows"]] == ref_windows
    assert tokens.tolist() == ref_tokens
    assert info["fingerprint"] == fingerprint(ref_tokens)


def test_c4_gzip_identical_to_plain(tmp_path):
    gz = tmp_path / "c4.jsonl.gz"
    gz.write_bytes(gzip.compress(C4.read_bytes()))
    plain, plain_tokens = run_calib(C4, tmp_path, 16, 256, 3)
    packed, packed_tokens = run_calib(gz, tmp_path, 16, 256, 3)
    assert packed["windows"] == plain["windows"]
    assert packed["fingerprint"] == plain["fingerprint"]
    assert (packed_tokens == plain_tokens).all()


@pytest.mark.parametrize("seed", [0, 7])
def test_text_windows_equal_python_randint(tmp_path, llama_tokenizer, seed):
    text = TINYSTORIES.read_bytes()[:100_000].decode("utf-8", errors="ignore")
    path = tmp_path / "stories.txt"
    path.write_bytes(text.encode("utf-8"))
    stream = llama_tokenizer(text)["input_ids"]  # one BOS at the start of the whole text
    nsamples, seqlen = 32, 512
    length = len(stream)
    random.seed(seed)
    starts = [random.randint(0, length - seqlen - 1) for _ in range(nsamples)]
    info, tokens = run_calib(path, tmp_path, nsamples, seqlen, seed)
    assert info["format"] == "text"
    assert info["stream_tokens"] == length
    assert [w["start"] for w in info["windows"]] == starts
    assert all(w["doc"] == -1 for w in info["windows"])
    expected = [t for s in starts for t in stream[s:s + seqlen]]
    assert tokens.tolist() == expected


@pytest.mark.parametrize("dtype,fmt", [("<u2", []), ("<u4", ["--calib-format", "tokens-u32"])])
def test_token_file_windows_equal_python_randint(tmp_path, dtype, fmt):
    rng = np.random.default_rng(5)
    stream = rng.integers(0, 32000, size=50_000).astype(dtype)
    path = tmp_path / "tokens.bin"
    stream.tofile(path)
    nsamples, seqlen, seed = 20, 1024, 4
    random.seed(seed)
    starts = [random.randint(0, stream.size - seqlen - 1) for _ in range(nsamples)]
    info, tokens = run_calib(path, tmp_path, nsamples, seqlen, seed, *fmt)
    assert info["format"] == ("tokens-u16" if dtype == "<u2" else "tokens-u32")
    assert [w["start"] for w in info["windows"]] == starts
    expected = np.concatenate([stream[s:s + seqlen] for s in starts]).astype(np.int64)
    assert (tokens.astype(np.int64) == expected).all()


def run_error(tmp_path, calib, *extra):
    out = tmp_path / "never.bin"
    cmd = [BIN, "calib", "--tokenizer", str(TOKENIZER), "--calib", str(calib), "--out", str(out), *extra]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 1
    assert not out.exists()
    assert not list(tmp_path.glob("never.bin.tmp*"))
    return result.stderr.strip()


def test_cli_errors(tmp_path):
    missing = tmp_path / "missing.jsonl"
    assert run_error(tmp_path, missing) == f"symprune: error: {missing}: calibration file not found"
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert run_error(tmp_path, empty) == f"symprune: error: {empty}: calibration file is empty"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no text"}\n')
    assert run_error(tmp_path, bad) == f'symprune: error: {bad} line 2: no "text" field'
    # C4 sample: the longest of the 1000 documents is far below 100000 tokens.
    message = run_error(tmp_path, C4, "--seqlen", "100000", "--nsamples", "2")
    assert message.startswith(f"symprune: error: no document in {C4} has more than T=100000 tokens (the longest "
                              "of its 1000 documents has ")
    short = tmp_path / "short.txt"
    short.write_text("Hello world")  # BOS + 2 tokens
    assert run_error(tmp_path, short, "--seqlen", "512") == (
        f"symprune: error: {short}: 3 tokens; a window of T=512 needs at least T+1 = 513 tokens, so no window "
        "fits; at most --seqlen 2 would fit")
    big = tmp_path / "ids.bin"
    np.array([5, 40000], dtype="<u2").tofile(big)
    assert run_error(tmp_path, big, "--seqlen", "1") == (
        f"symprune: error: {big}: token id 40000 at position 1 is outside the vocabulary (size 32000)")
