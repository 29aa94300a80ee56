"""Nothing lost, nothing misread: inputs that used to be refused although valid, or accepted although
garbage, on the stories260K model.

- safetensors files whose 8-byte header length begins 80 02..05 (like a pickle) are safetensors."""
import json
import shutil
import struct
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from prune_support import Stories, symprune, tree_digest

CALIB = ["--nsamples", "4", "--seqlen", "64"]
WANDA = ["--method", "wanda", "--sparsity", "0.5"]


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    s = Stories(tmp_path_factory.mktemp("stories"))
    s.digest = tree_digest(s.model)
    return s


def header_length(path):
    return struct.unpack("<Q", Path(path).read_bytes()[:8])[0]


def pad_header(path, length):
    """Rewrites a safetensors file with its JSON header padded with spaces to `length` bytes."""
    data = Path(path).read_bytes()
    n = header_length(path)
    assert n <= length, (n, length)
    Path(path).write_bytes(struct.pack("<Q", length) + data[8:8 + n] + b" " * (length - n) + data[8 + n:])
    assert Path(path).read_bytes()[0] == 0x80 and 2 <= Path(path).read_bytes()[1] <= 5


# --- safetensors headers that begin like a pickle --------------------------------------------------

def test_single_file_with_pickle_like_header_length(stories, tmp_path):
    model = shutil.copytree(stories.model, tmp_path / "model")
    pad_header(model / "model.safetensors", 0x10280)  # bytes 80 02 01 00 ...
    with safe_open(str(model / "model.safetensors"), framework="numpy") as f:  # valid for the reference
        assert len(list(f.keys())) == 47
    out = symprune("inspect", "--model", model)
    assert "check: ok, 47 tensors match config.json" in out.stdout
    symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out", tmp_path / "pruned")
    assert load_file(str(tmp_path / "pruned" / "model.safetensors")).keys() == load_file(
        str(model / "model.safetensors")).keys()


def test_sharded_model_with_pickle_like_header_lengths(stories, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for path in stories.model.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, model / path.name)
    tensors = load_file(str(stories.model / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:24], "model-00002-of-00002.safetensors": names[24:]}
    weight_map = {}
    for (shard, members), length in zip(shards.items(), (0x10380, 0x20480)):
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
        pad_header(model / shard, length)
        weight_map.update({n: shard for n in members})
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    out = symprune("inspect", "--model", model)
    assert "weights: 2 file(s) via model.safetensors.index.json" in out.stdout
    assert "check: ok" in out.stdout
    symprune("prune", "--model", model, *WANDA, "--calib", stories.first, *CALIB, "--out", tmp_path / "pruned")
    assert sorted(p.name for p in (tmp_path / "pruned").glob("*.safetensors")) == sorted(shards)
