"""docs/errors.md is the catalogue of user-facing errors; this file holds one trigger per entry.

Each trigger builds a bad input under tmp_path and runs the symprune CLI. The test asserts exit code 1,
that stderr contains the documented message (placeholders `<...>` match anything), and that the run
changed nothing: every file and directory under tmp_path (inputs and the would-be outputs) is exactly
as before, and so is the shared stories260K model. Every id documented has a trigger and every trigger
is documented, so the catalogue and the tests cannot drift apart."""
import fcntl
import json
import os
import re
import resource
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from prune_support import BIN, SOURCE, Stories, head_overflowing_model, tree_digest

DOC = SOURCE / "docs" / "errors.md"
DIST_EMULATED = os.environ.get("SYMPRUNE_DIST_EMULATED_BIN")
CALIB = ["--nsamples", "4", "--seqlen", "64"]


# ---------------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------------

def parse_catalog(text):
    """{id: message} from `### E-ID` headings, each followed by a `Message: ``...``` line."""
    entries = {}
    for match in re.finditer(r"^### (E-[A-Z0-9-]+)[ \t]*\n(.*?)(?=^#{2,3} |\Z)", text, re.M | re.S):
        error_id, body = match.groups()
        assert error_id not in entries, f"{error_id} documented twice"
        message = re.search(r"^Message: ``(.+?)``[ \t]*$", body, re.M)
        assert message, f"{error_id}: no `Message: ``...``` line"
        for field in ("Cause:", "Fix:"):
            assert field in body, f"{error_id}: no {field}"
        entries[error_id] = message.group(1).strip()
    return entries


def message_regex(message):
    """The documented message as a regex: <placeholders> match anything (within one message)."""
    parts = re.split(r"<[a-z][a-z0-9 _/.-]*>", message)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.S)


CATALOG = parse_catalog(DOC.read_text())


# ---------------------------------------------------------------------------------------------------
# Helpers to build bad inputs
# ---------------------------------------------------------------------------------------------------

class Case:
    """A command line (paths as str/Path) and an optional RLIMIT_FSIZE for the child."""

    def __init__(self, *args, fsize=None, cleanup=None, env=None, cwd=None):
        self.binary = BIN  # the program run (symprune, unless a trigger names another)
        self.args = [str(a) for a in args]
        self.env = env  # extra environment variables
        self.cwd = cwd  # the directory it runs in (else the test's)
        self.fsize = fsize
        self.cleanup = cleanup  # called after the run (e.g. to unmount)


def copy_model(env, tmp, name="model"):
    dst = tmp / name
    shutil.copytree(env.model, dst)
    return dst


def config_prune(env, tmp, **changes):
    """A prune of a copy of the model whose config.json has `changes`."""
    model = copy_model(env, tmp)
    edit_config(model, **changes)
    return prune(env, tmp, model=model)


def edit_config(model, **changes):
    path = model / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))


def write_raw_safetensors(path, header, data=b"", header_len=None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(text) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", length) + text + data)


def one_tensor_file(path, entry, data_len=16):
    write_raw_safetensors(path, {"w": entry}, b"\0" * data_len)


def shard_model(env, tmp, weight_map_edit=None):
    """The stories model as one shard plus an index; weight_map_edit(map) may change the map."""
    model = copy_model(env, tmp)
    shard = "model-00001-of-00001.safetensors"
    (model / "model.safetensors").rename(model / shard)
    names = sorted(load_file(str(model / shard)).keys())
    weight_map = {n: shard for n in names}
    if weight_map_edit:
        weight_map_edit(weight_map)
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return model


def edit_tensors(env, tmp, edit):
    model = copy_model(env, tmp)
    tensors = load_file(str(model / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    return model


def poisoned_model(env, tmp, name, index, value):
    """A copy of the model whose tensor `name` holds `value` at `index`."""
    def poison(tensors):
        w = tensors[name].copy()
        w[index] = value
        tensors[name] = w
    return edit_tensors(env, tmp, poison)


def prune(env, tmp, *args, model=None, method=("--method", "magnitude", "--sparsity", "0.5")):
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    return Case("prune", "--model", model or env.model, *method, *args, "--out", out / "pruned", "--report",
                out / "report.json")


def tokenize(tokenizer):
    return Case("tokenize", "--tokenizer", tokenizer, "--text", "Once upon a time")


def calib_prune(env, tmp, calib, *extra, model=None):
    return prune(env, tmp, "--calib", calib, *(extra or CALIB), model=model,
                 method=("--method", "wanda", "--sparsity", "0.5"))


# ---------------------------------------------------------------------------------------------------
# Triggers: TRIGGERS[id](env, tmp) -> Case
# ---------------------------------------------------------------------------------------------------

TRIGGERS = {}


def trigger(error_id):
    def register(fn):
        assert error_id not in TRIGGERS, error_id
        TRIGGERS[error_id] = fn
        return fn
    return register


# --- model resolution ------------------------------------------------------------------------------

@trigger("E-MODEL-NOT-FOUND")
def _(env, tmp):
    return prune(env, tmp, model=tmp / "no_such_model")


@trigger("E-MODEL-NO-CONFIG")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "config.json").unlink()
    return prune(env, tmp, model=model)


# --- safetensors -----------------------------------------------------------------------------------

@trigger("E-ST-NO-WEIGHTS")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").unlink()
    return prune(env, tmp, model=model)


@trigger("E-ST-PICKLE-ONLY")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").unlink()
    (model / "consolidated.00.pth").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    return prune(env, tmp, model=model)


def torch_model(env, tmp, state=None, **save_options):
    """The model with its weights as pytorch_model.bin (torch.save of `state`, default its state dict)."""
    import torch
    model = copy_model(env, tmp)
    weights = model / "model.safetensors"
    if state is None:
        state = {name: torch.from_numpy(array) for name, array in load_file(weights).items()}
    weights.unlink()
    torch.save(state, model / "pytorch_model.bin", **save_options)
    return model


class RunsCode:
    """Pickles as a call of os.system: a checkpoint that would create `marker` if it were unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@trigger("E-PT-UNSAFE-PICKLE")
def _(env, tmp):
    import pickle
    import zipfile
    model = copy_model(env, tmp)
    (model / "model.safetensors").unlink()
    # Had the pickle run, tmp/ran would exist: the catalogue test finds tmp changed.
    with zipfile.ZipFile(model / "pytorch_model.bin", "w") as archive:
        archive.writestr("pytorch_model/data.pkl", pickle.dumps({"w": RunsCode(tmp / "ran")}, protocol=2))
        archive.writestr("pytorch_model/version", "3\n")
    return prune(env, tmp, model=model)


@trigger("E-PT-NOT-STATE-DICT")
def _(env, tmp):
    import torch
    return prune(env, tmp, model=torch_model(env, tmp, {"model": {"w": torch.zeros(2)}, "step": 3}))


@trigger("E-PT-LEGACY")
def _(env, tmp):
    return prune(env, tmp, model=torch_model(env, tmp, _use_new_zipfile_serialization=False))


@trigger("E-PT-STORAGE-SIZE")
def _(env, tmp):
    import zipfile
    model = torch_model(env, tmp)
    weights = model / "pytorch_model.bin"
    with zipfile.ZipFile(weights) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    storage = next(name for name in records if name.endswith("/data/0"))
    records[storage] = records[storage][:-4]
    with zipfile.ZipFile(weights, "w") as archive:
        for name, data in records.items():
            archive.writestr(name, data)
    return prune(env, tmp, model=model)


@trigger("E-PT-BROADCAST-VIEW")
def _(env, tmp):
    import torch
    state = {name: torch.from_numpy(array) for name, array in load_file(env.model / "model.safetensors").items()}
    state["ones"] = torch.ones(4).expand(64, 4)
    return prune(env, tmp, model=torch_model(env, tmp, state))


@trigger("E-PT-TRUNCATED")
def _(env, tmp):
    model = torch_model(env, tmp)
    weights = model / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[:-4096])
    return prune(env, tmp, model=model)


@trigger("E-ST-PICKLE")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").write_bytes(b"\x80\x02}q\x00(X\x05\x00\x00\x00model" + b"\0" * 64)
    return prune(env, tmp, model=model)


@trigger("E-ST-TRUNCATED")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").write_bytes(b"\x10\0\0")
    return prune(env, tmp, model=model)


@trigger("E-ST-HEADER-TOO-BIG")
def _(env, tmp):
    model = copy_model(env, tmp)
    write_raw_safetensors(model / "model.safetensors", b"{}", header_len=1 << 40)
    return prune(env, tmp, model=model)


@trigger("E-ST-HEADER-PAST-END")
def _(env, tmp):
    model = copy_model(env, tmp)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[:100])
    return prune(env, tmp, model=model)


@trigger("E-ST-HEADER-NOT-OBJECT")
def _(env, tmp):
    model = copy_model(env, tmp)
    write_raw_safetensors(model / "model.safetensors", b"[1, 2, 3]")
    return prune(env, tmp, model=model)


@trigger("E-ST-HEADER-INVALID-JSON")
def _(env, tmp):
    model = copy_model(env, tmp)
    write_raw_safetensors(model / "model.safetensors", b'{"w": {"dtype": "F32", ')
    return prune(env, tmp, model=model)


@trigger("E-ST-BAD-DTYPE")
def _(env, tmp):
    model = edit_tensors(env, tmp, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].astype(np.float64)}))
    return prune(env, tmp, model=model)


@trigger("E-ST-UNKNOWN-DTYPE")
def _(env, tmp):
    model = copy_model(env, tmp)
    one_tensor_file(model / "model.safetensors", {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 16]})
    return prune(env, tmp, model=model)


def changed_during_run(env, tmp, change, prepare=None):
    """A prune whose model `change(model)` alters once the run has mapped the weights: the calibration file
    is a pipe, which prune opens after mapping the weights; once it does, the model is changed, then the
    text arrives and pruning goes on. The model and the pipe live outside tmp (the model is changed, on
    purpose); `prepare(model)` may lay the copy out first."""
    outside = Path(tempfile.mkdtemp(prefix="changed_"))
    model = shutil.copytree(env.model, outside / "model")
    if prepare:
        prepare(model)
    fifo = outside / "calib.fifo"
    os.mkfifo(fifo)
    text = env.first.read_bytes()
    done = threading.Event()

    def feed():
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.01)
                continue
            change(model)
            os.set_blocking(fd, True)
            try:
                os.write(fd, text)
            except BrokenPipeError:
                pass
            os.close(fd)
            return

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()

    def cleanup():
        done.set()
        feeder.join()
        shutil.rmtree(outside)
    case = prune(env, tmp, "--calib", fifo, *CALIB, model=model, method=("--method", "wanda", "--sparsity", "0.5"))
    case.cleanup = cleanup
    return case


@trigger("E-ST-FILE-SHRANK")
def _(env, tmp):
    def shrink(model):  # keep model.embed_tokens.weight only
        weights = model / "model.safetensors"
        header_len = struct.unpack("<Q", weights.read_bytes()[:8])[0]
        os.truncate(weights, 8 + header_len + 512 * 64 * 4)
    return changed_during_run(env, tmp, shrink)


@trigger("E-MODEL-CHANGED-DURING-RUN")
def _(env, tmp):
    def touch(model):  # the config rewritten with the same bytes: a new modification time
        config = model / "config.json"
        stamp = config.stat()
        os.utime(config, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
    return changed_during_run(env, tmp, touch)


@trigger("E-MODEL-SYNTHETIC-UNKNOWN")
def _(env, tmp):
    return Case("prune", "--model", "synthetic:no-such-shape", "--method", "magnitude", "--sparsity", "0.5")


@trigger("E-MODEL-SYNTHETIC-SPEC")
def _(env, tmp):
    return Case("prune", "--model", "synthetic:tiny-llama:abc", "--method", "magnitude", "--sparsity", "0.5")


@trigger("E-MODEL-SYNTHETIC-LAYERS")
def _(env, tmp):
    return Case("prune", "--model", "synthetic:tiny-llama:layers=0", "--method", "magnitude", "--sparsity", "0.5")


@trigger("E-CFG-UNDECLARED-BIAS")
def _(env, tmp):
    def add_bias(tensors):
        rows = tensors["model.layers.1.self_attn.v_proj.weight"].shape[0]
        tensors["model.layers.1.self_attn.v_proj.bias"] = np.zeros(rows, dtype=np.float32)
    return prune(env, tmp, model=edit_tensors(env, tmp, add_bias))


@trigger("E-CFG-ARCHITECTURE-BIAS")
def _(env, tmp):
    # stories260K read as Qwen2: the q/k/v biases it needs, and one on an o_proj, which it has not.
    def add_biases(tensors):
        for layer in range(5):
            for name in ("q_proj", "k_proj", "v_proj") + (("o_proj",) if layer == 1 else ()):
                rows = tensors[f"model.layers.{layer}.self_attn.{name}.weight"].shape[0]
                tensors[f"model.layers.{layer}.self_attn.{name}.bias"] = np.zeros(rows, dtype=np.float32)
    model = edit_tensors(env, tmp, add_biases)
    edit_config(model, model_type="qwen2")
    return prune(env, tmp, model=model)


@trigger("E-ST-OFFSETS-REVERSED")
def _(env, tmp):
    model = copy_model(env, tmp)
    one_tensor_file(model / "model.safetensors", {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]})
    return prune(env, tmp, model=model)


@trigger("E-ST-OUT-OF-RANGE")
def _(env, tmp):
    model = copy_model(env, tmp)
    one_tensor_file(model / "model.safetensors", {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]})
    return prune(env, tmp, model=model)


@trigger("E-ST-SIZE-MISMATCH")
def _(env, tmp):
    model = copy_model(env, tmp)
    one_tensor_file(model / "model.safetensors", {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]})
    return prune(env, tmp, model=model)


@trigger("E-ST-GAP")
def _(env, tmp):
    model = copy_model(env, tmp)
    write_raw_safetensors(model / "model.safetensors",
                          {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, b"\0" * 16)
    return prune(env, tmp, model=model)


@trigger("E-ST-TRAILING-BYTES")
def _(env, tmp):
    model = copy_model(env, tmp)
    with open(model / "model.safetensors", "ab") as f:
        f.write(b"\0" * 64)
    return prune(env, tmp, model=model)


@trigger("E-ST-OVERLAP")
def _(env, tmp):
    model = copy_model(env, tmp)
    write_raw_safetensors(model / "model.safetensors",
                          {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16)
    return prune(env, tmp, model=model)


@trigger("E-ST-NEGATIVE-SHAPE")
def _(env, tmp):
    model = copy_model(env, tmp)
    one_tensor_file(model / "model.safetensors", {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]})
    return prune(env, tmp, model=model)


@trigger("E-ST-SHARD-TRAVERSAL")
def _(env, tmp):
    (tmp / "outside.safetensors").write_bytes(b"")
    model = shard_model(env, tmp, lambda m: m.update({"model.norm.weight": "../outside.safetensors"}))
    return prune(env, tmp, model=model)


@trigger("E-ST-SHARD-ABSOLUTE")
def _(env, tmp):
    model = shard_model(env, tmp, lambda m: m.update({"model.norm.weight": str(tmp / "abs.safetensors")}))
    return prune(env, tmp, model=model)


@trigger("E-ST-SHARD-MISSING")
def _(env, tmp):
    model = shard_model(env, tmp, lambda m: m.update({"model.norm.weight": "model-00002-of-00002.safetensors"}))
    return prune(env, tmp, model=model)


@trigger("E-ST-LINK-DANGLING")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to("../blobs/0123abcd")  # a cache snapshot without its blob
    return prune(env, tmp, model=model)


@trigger("E-ST-INDEX-DUPLICATE-TENSOR")
def _(env, tmp):
    stale = "model.layers.2.self_attn.q_proj.weight"  # placed in a second shard, left in the first too
    model = shard_model(env, tmp, lambda m: m.update({stale: "model-00002-of-00002.safetensors"}))
    tensors = load_file(str(model / "model-00001-of-00001.safetensors"))
    save_file({stale: -tensors[stale]}, str(model / "model-00002-of-00002.safetensors"))
    return prune(env, tmp, model=model)


@trigger("E-ST-INDEX-MISSING-TENSOR")
def _(env, tmp):
    model = shard_model(env, tmp, lambda m: m.update({"model.layers.9.extra.weight": next(iter(m.values()))}))
    return prune(env, tmp, model=model)


@trigger("E-ST-INDEX-EMPTY")
def _(env, tmp):
    model = shard_model(env, tmp, lambda m: m.clear())
    return prune(env, tmp, model=model)


@trigger("E-ST-INDEX-NO-WEIGHT-MAP")
def _(env, tmp):
    model = shard_model(env, tmp)
    index = model / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weightmap"] = content.pop("weight_map")  # misspelled
    index.write_text(json.dumps(content))
    return prune(env, tmp, model=model)


@trigger("E-ST-INDEX-SHARD-NOT-STRING")
def _(env, tmp):
    model = shard_model(env, tmp, lambda m: m.update({"model.norm.weight": ["model-00001-of-00001.safetensors"]}))
    return prune(env, tmp, model=model)


@trigger("E-ST-SHARDS-WITHOUT-INDEX")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    return prune(env, tmp, model=model)


@trigger("E-ST-TENSOR-MISSING")
def _(env, tmp):
    model = edit_tensors(env, tmp, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    return prune(env, tmp, model=model)


@trigger("E-ST-SHAPE-MISMATCH")
def _(env, tmp):
    return config_prune(env, tmp, intermediate_size=176)


# --- non-finite weights and activations ------------------------------------------------------------

@trigger("E-WEIGHT-NONFINITE")
def _(env, tmp):
    return prune(env, tmp, model=poisoned_model(env, tmp, "model.layers.1.self_attn.v_proj.weight", (3, 5), np.nan))


@trigger("E-ACTIVATION-NONFINITE")
def _(env, tmp):
    # Finite but huge (a NaN/Inf norm is E-TENSOR-NONFINITE): the attention output, o_proj's input, overflows.
    model = edit_tensors(env, tmp, lambda t: t["model.layers.0.self_attn.v_proj.weight"].fill(3e38))
    return prune(env, tmp, "--calib", env.first, *CALIB, model=model,
                 method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-TENSOR-NONFINITE")
def _(env, tmp):
    return prune(env, tmp, model=poisoned_model(env, tmp, "model.norm.weight", 0, np.inf))


# --- config.json -----------------------------------------------------------------------------------

@trigger("E-JSON-INVALID")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "config.json").write_text('{"model_type": "llama",')
    return prune(env, tmp, model=model)


@trigger("E-JSON-TOO-DEEP")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "config.json").write_text("[" * 100 + "]" * 100)
    return prune(env, tmp, model=model)


@trigger("E-CFG-NOT-OBJECT")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "config.json").write_text("[1, 2]")
    return prune(env, tmp, model=model)


@trigger("E-CFG-NO-MODEL-TYPE")
def _(env, tmp):
    return config_prune(env, tmp, model_type=None)


@trigger("E-CFG-MODEL-TYPE")
def _(env, tmp):
    return config_prune(env, tmp, model_type="gpt_neox")


@trigger("E-MODEL-TIED-HEAD-AMBIGUOUS")
def _(env, tmp):
    model = copy_model(env, tmp)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 0.5
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    return prune(env, tmp, model=model)


@trigger("E-CFG-NOT-INTEGER")
def _(env, tmp):
    return config_prune(env, tmp, num_hidden_layers="five")


@trigger("E-CFG-NOT-POSITIVE")
def _(env, tmp):
    return config_prune(env, tmp, hidden_size=0)


@trigger("E-CFG-NOT-BOOLEAN")
def _(env, tmp):
    return config_prune(env, tmp, tie_word_embeddings="true")


@trigger("E-CFG-EXTRA-LAYERS")
def _(env, tmp):
    return config_prune(env, tmp, num_hidden_layers=4)


@trigger("E-CFG-HEADS")
def _(env, tmp):
    return config_prune(env, tmp, num_attention_heads=7)


@trigger("E-CFG-KV-HEADS")
def _(env, tmp):
    return config_prune(env, tmp, num_key_value_heads=3)


@trigger("E-CFG-ACTIVATION")
def _(env, tmp):
    return config_prune(env, tmp, hidden_act="gelu")


@trigger("E-CFG-ROPE-SCALING")
def _(env, tmp):
    return config_prune(env, tmp, rope_scaling={"type": "yarn", "factor": 4.0})


@trigger("E-CFG-ROPE-NO-TYPE")
def _(env, tmp):
    return config_prune(env, tmp, rope_scaling={"factor": 4.0})


@trigger("E-CFG-ROPE-DISAGREE")
def _(env, tmp):
    return config_prune(env, tmp, rope_theta=10000.0,
                        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


@trigger("E-CFG-ROPE-PARTIAL")
def _(env, tmp):
    return config_prune(env, tmp, partial_rotary_factor=0.5)


# --- tokenizers ------------------------------------------------------------------------------------

@trigger("E-TOK-NONE")
def _(env, tmp):
    model = copy_model(env, tmp)
    (model / "tokenizer.bin").unlink()
    (model / "tokenizer.json").unlink()
    return tokenize(model)


@trigger("E-TOK-NOT-FOUND")
def _(env, tmp):
    return tokenize(tmp / "no_such_tokenizer.model")


@trigger("E-TOK-UNKNOWN-FORMAT")
def _(env, tmp):
    (tmp / "tokenizer.txt").write_text("hello")
    return tokenize(tmp / "tokenizer.txt")


@trigger("E-TOK-SENTENCEPIECE")
def _(env, tmp):
    (tmp / "tokenizer.model").write_bytes(b"\xff\xfe not a protobuf \x01\x02\x03" * 4)
    return tokenize(tmp / "tokenizer.model")


@trigger("E-TOK-LLAMA2C-TRUNCATED")
def _(env, tmp):
    data = (env.model / "tokenizer.bin").read_bytes()
    (tmp / "tokenizer.bin").write_bytes(data[:1000])
    return tokenize(tmp / "tokenizer.bin")


@trigger("E-TOK-LLAMA2C-TRAILING")
def _(env, tmp):
    model = copy_model(env, tmp)
    edit_config(model, vocab_size=500)  # the tokenizer.bin holds 512 tokens
    return tokenize(model)


@trigger("E-TOK-JSON-MALFORMED")
def _(env, tmp):
    (tmp / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    return tokenize(tmp / "tokenizer.json")


@trigger("E-TOK-JSON-UNSUPPORTED")
def _(env, tmp):
    (tmp / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    return tokenize(tmp / "tokenizer.json")


@trigger("E-TOK-JSON-NORMALIZER")
def _(env, tmp):
    # The normalizer of LLaMA-2's tokenizer.json (a SentencePiece model converted to BPE).
    normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                      {"type": "Replace", "pattern": {"String": " "},
                                                       "content": "\u2581"}]}
    (tmp / "tokenizer.json").write_text(json.dumps(
        {"normalizer": normalizer, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    return tokenize(tmp / "tokenizer.json")


@trigger("E-TOK-GPT2-PAIR")
def _(env, tmp):
    (tmp / "vocab.json").write_text(json.dumps({"a": 0}))
    return tokenize(tmp / "vocab.json")


# --- text and other input files --------------------------------------------------------------------

def eval_text(env, text):
    return Case("eval", "--model", env.model, "--text", text, "--seqlen", "64", "--max-chunks", "1")


@trigger("E-TOK-NO-TEXT")
def _(env, tmp):
    return Case("tokenize", "--tokenizer", env.model)


@trigger("E-TOK-TEXTS-JSON")
def _(env, tmp):
    (tmp / "texts.json").write_text(json.dumps({"texts": ["Once upon a time"]}))
    return Case("tokenize", "--tokenizer", env.model, "--texts-json", tmp / "texts.json")


@trigger("E-TOK-TEXTS-JSON-NUL")
def _(env, tmp):
    (tmp / "texts.json").write_text(json.dumps(["Once upon a time", "a\u0000b"]))
    return Case("tokenize", "--tokenizer", env.model, "--texts-json", tmp / "texts.json")


@trigger("E-TOK-TEXT-NOT-UTF8")
def _(env, tmp):
    return Case("tokenize", "--tokenizer", env.model, "--text", os.fsdecode(b"a\xffb"))


@trigger("E-TEXT-NOT-FOUND")
def _(env, tmp):
    return eval_text(env, tmp / "no_such_text.txt")


@trigger("E-INPUT-IS-DIRECTORY")
def _(env, tmp):
    (tmp / "texts").mkdir()
    return prune(env, tmp, "--eval", tmp / "texts")


@trigger("E-INPUT-NOT-REGULAR")
def _(env, tmp):
    return eval_text(env, "/dev/zero")


@trigger("E-INPUT-READ")
def _(env, tmp):
    return Case("tokenize", "--tokenizer", env.model, "--text-file", "/proc/self/mem")


@trigger("E-TEXT-NOT-UTF8")
def _(env, tmp):
    (tmp / "utf16.txt").write_bytes(env.second.read_text().encode("utf-16"))
    return eval_text(env, tmp / "utf16.txt")


@trigger("E-TEXT-NUL")
def _(env, tmp):
    (tmp / "padded.txt").write_bytes(env.first.read_bytes()[:20000] + b"\0" * 4096)
    return calib_prune(env, tmp, tmp / "padded.txt")


# --- calibration data ------------------------------------------------------------------------------

@trigger("E-CAL-NEEDED")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-CAL-NOT-FOUND")
def _(env, tmp):
    return calib_prune(env, tmp, tmp / "no_such_calib.txt")


@trigger("E-CAL-EMPTY")
def _(env, tmp):
    (tmp / "empty.txt").write_bytes(b"")
    return calib_prune(env, tmp, tmp / "empty.txt")


@trigger("E-CAL-TOO-SHORT")
def _(env, tmp):
    (tmp / "tiny.txt").write_text("Once upon a time there was a cat.\n")
    return calib_prune(env, tmp, tmp / "tiny.txt")


@trigger("E-CAL-NO-LONG-DOCUMENT")
def _(env, tmp):
    (tmp / "short.jsonl").write_text("".join(json.dumps({"text": f"A cat number {i}."}) + "\n" for i in range(5)))
    return calib_prune(env, tmp, tmp / "short.jsonl")


@trigger("E-CAL-GZIP-CORRUPT")
def _(env, tmp):
    import gzip
    docs = "".join(json.dumps({"text": env.first.read_text()[i:i + 2000]}) + "\n" for i in range(0, 40000, 2000))
    data = gzip.compress(docs.encode())
    (tmp / "c4.jsonl.gz").write_bytes(data[:len(data) // 2])  # an interrupted download
    return calib_prune(env, tmp, tmp / "c4.jsonl.gz")


@trigger("E-CAL-JSONL-INVALID")
def _(env, tmp):
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    return calib_prune(env, tmp, tmp / "bad.jsonl")


@trigger("E-CAL-JSONL-NOT-OBJECT")
def _(env, tmp):
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\n["an array, not a record"]\n')
    return calib_prune(env, tmp, tmp / "bad.jsonl")


@trigger("E-CAL-JSONL-NO-TEXT")
def _(env, tmp):
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\n{"content": "no text field"}\n')
    return calib_prune(env, tmp, tmp / "bad.jsonl")


@trigger("E-CAL-JSONL-TEXT-TYPE")
def _(env, tmp):
    (tmp / "bad.jsonl").write_text('{"text": 42}\n')
    return calib_prune(env, tmp, tmp / "bad.jsonl")


@trigger("E-CAL-JSONL-BLANK")
def _(env, tmp):
    (tmp / "blank.jsonl").write_text("\n  \n\t\n")
    return calib_prune(env, tmp, tmp / "blank.jsonl")


@trigger("E-CAL-TOKENS-WIDTH")
def _(env, tmp):
    (tmp / "tokens.bin").write_bytes(b"\x01\x00\x02")
    return calib_prune(env, tmp, tmp / "tokens.bin")


@trigger("E-CAL-TOKENS-LOOK-LIKE-TEXT")
def _(env, tmp):
    (tmp / "stories.bin").write_bytes(env.first.read_bytes()[:20000])
    return calib_prune(env, tmp, tmp / "stories.bin")


@trigger("E-CAL-TOKENS-LOOK-LIKE-U32")
def _(env, tmp):
    np.arange(1, 1001, dtype="<u4").tofile(tmp / "tokens.bin")  # as `symprune calib --out` writes
    return calib_prune(env, tmp, tmp / "tokens.bin")


@trigger("E-CAL-TOKEN-RANGE")
def _(env, tmp):
    np.full(1000, 7, dtype="<u2").tofile(tmp / "tokens.bin")
    data = np.fromfile(tmp / "tokens.bin", dtype="<u2")
    data[500] = 60000
    data.tofile(tmp / "tokens.bin")
    return calib_prune(env, tmp, tmp / "tokens.bin")


@trigger("E-CAL-TOKENIZER-RANGE")
def _(env, tmp):
    # LLaMA-2's 32000-piece tokenizer for the 512-token stories260K.
    return calib_prune(env, tmp, env.first, *CALIB, "--tokenizer", env.data / "llama2c_tokenizer" / "tokenizer.model")


@trigger("E-CAL-FORMAT")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, *CALIB, "--calib-format", "csv")


@trigger("E-CAL-NSAMPLES")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, "--nsamples", "0", "--seqlen", "64")


@trigger("E-CAL-SEQLEN-TOO-LONG")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, "--nsamples", "4", "--seqlen", "100000")


@trigger("E-CAL-SEQLEN-WINDOW")
def _(env, tmp):
    model = copy_model(env, tmp)  # stories260K read as Mistral with a window of 32 tokens
    edit_config(model, model_type="mistral", sliding_window=32)
    return calib_prune(env, tmp, env.first, "--nsamples", "4", "--seqlen", "33", model=model)


@trigger("E-CAL-SEQLEN-DEFAULT")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, "--nsamples", "4")  # stories260K: max_position_embeddings 512


@trigger("E-CAL-SEQLEN-ZERO")
def _(env, tmp):
    # 0 stands for "not given" inside the configuration; on the command line it is refused, not the default.
    return calib_prune(env, tmp, env.first, "--nsamples", "4", "--seqlen", "0")


@trigger("E-HOST-MEMORY")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, "--nsamples", "100000000", "--seqlen", "64")


@trigger("E-BLAS-ADDRESS-SPACE")
def _(env, tmp):
    # eval has no address-space check of its own (its host memory plan does not look at ulimit -v): the
    # backend's, before the first product (it used to spin at full CPU there).
    case = eval_text(env, env.second)
    case.env = {"SYMPRUNE_ADDRESS_SPACE_LEFT": str(50 << 20)}
    return case


@trigger("E-CAL-ADDRESS-SPACE")
def _(env, tmp):
    # As under `ulimit -v`, where the BLAS library used to spin forever (checked by hand with a real limit;
    # sanitizer builds cannot run under one).
    case = calib_prune(env, tmp, env.first)
    case.env = {"SYMPRUNE_ADDRESS_SPACE_LEFT": str(200 << 20)}
    return case


# --- prune options ---------------------------------------------------------------------------------

@trigger("E-OPT-THREADS-ADDRESS-SPACE")
def _(env, tmp):
    case = prune(env, tmp, "--threads", str(4 * os.cpu_count()))  # more than the BLAS threads started
    case.env = {"SYMPRUNE_ADDRESS_SPACE_LEFT": str(100 << 20)}
    return case


@trigger("E-OPT-SPARSITY-RANGE")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--sparsity", "1.5"))


@trigger("E-OPT-NM-SYNTAX")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--nm", "2-4"))


@trigger("E-OPT-NM-ORDER")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--nm", "4:2"))


@trigger("E-OPT-NM-DIVIDES")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--nm", "3:7"))


@trigger("E-OPT-SPARSITY-XOR-NM")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--sparsity", "0.5", "--nm", "2:4"))


@trigger("E-OPT-UNKNOWN-METHOD")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "wandaa", "--sparsity", "0.5"))


@trigger("E-OPT-GROUP")
def _(env, tmp):
    return prune(env, tmp, "--group", "column")


@trigger("E-OPT-COMPAT")
def _(env, tmp):
    return prune(env, tmp, "--compat", "sparsegpt")


@trigger("E-OPT-UNKNOWN")
def _(env, tmp):
    return prune(env, tmp, "--bogus-option", "3")


@trigger("E-OPT-NM-POSITIVE")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--nm", "0:4"))


@trigger("E-OPT-ALPHA-RANGE")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, *CALIB, "--alpha", "-1")


@trigger("E-SCORE-SATURATED")
def _(env, tmp):
    def scale(tensors):
        tensors["model.layers.2.self_attn.q_proj.weight"] *= 1e20
    return prune(env, tmp, model=edit_tensors(env, tmp, scale), method=("--method", "symmetric", "--sparsity", "0.5"))


@trigger("E-OPT-UNEXPECTED-ARGUMENT")
def _(env, tmp):
    return prune(env, tmp, "0.5")  # a value without its option


@trigger("E-CMD-UNKNOWN")
def _(env, tmp):
    return Case("prnue", "--model", env.model)


@trigger("E-CMD-REQUIRED")
def _(env, tmp):
    return Case("--log-level", "info")


@trigger("E-OPT-EMPTY")
def _(env, tmp):
    return prune(env, tmp, "--checkpoint", "")  # an unset $CKPT: the run would have gone on without one


@trigger("E-OPT-NOT-A-NUMBER")
def _(env, tmp):
    return prune(env, tmp, method=("--method", "magnitude", "--sparsity", "half"))


@trigger("E-OPT-INTEGER-SYNTAX")
def _(env, tmp):
    return prune(env, tmp, "--method-seed", "-1", method=("--method", "stochria", "--sparsity", "0.5"))


@trigger("E-OPT-INTEGER-RANGE")
def _(env, tmp):
    return prune(env, tmp, "--nsamples", str(2 ** 64), method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-OPT-NAN")
def _(env, tmp):
    return prune(env, tmp, "--alpha", "nan", method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-OPT-INFINITE")
def _(env, tmp):
    return prune(env, tmp, "--beta", "inf", method=("--method", "stochria", "--sparsity", "0.5"))


@trigger("E-OPT-NOT-DECIMAL")
def _(env, tmp):
    return prune(env, tmp, "--sparsity", "0x0.8", method=("--method", "magnitude"))


@trigger("E-OPT-UNDERFLOW")
def _(env, tmp):
    return prune(env, tmp, "--alpha", "1e-400", method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-CAL-SYNTHETIC-NO-TOKENIZER")
def _(env, tmp):
    return Case("prune", "--model", "synthetic:tiny-llama", "--method", "wanda", "--sparsity", "0.5", "--calib",
                env.first, *CALIB)


# Options refused with their own message: (id, method, further options).
MAGNITUDE = ("--method", "magnitude", "--sparsity", "0.5")
for _id, _method, _args in [
        ("E-OPT-REPEATED", MAGNITUDE, ["--seed", "1", "--seed", "2"]),
        ("E-OPT-LOG-LEVEL", MAGNITUDE, ["--log-level", "loud"]),
        ("E-OPT-DEVICE", MAGNITUDE, ["--device", "tpu"]),
        ("E-OPT-DTYPE", MAGNITUDE, ["--dtype", "int8"]),
        ("E-OPT-DTYPE-CPU", MAGNITUDE, ["--dtype", "bf16", "--device", "cpu"]),
        ("E-OPT-LP-P", ("--method", "lp", "--sparsity", "0.5", "--p", "5"), ["--calib", "<first>", *CALIB]),
        ("E-OPT-LP-STRATEGY", ("--method", "lp", "--sparsity", "0.5", "--strategy", "5"), ["--calib", "<first>", *CALIB]),
        ("E-OPT-STOCHRIA-BETA", ("--method", "stochria", "--sparsity", "0.5", "--beta", "0"),
         ["--calib", "<first>", *CALIB])]:
    trigger(_id)(lambda env, tmp, _method=_method, _args=_args: prune(
        env, tmp, *[env.first if a == "<first>" else a for a in _args], method=_method))


@trigger("E-DEV-MEMORY")
def _(env, tmp):
    # On the CPU emulation of CUDA (symprune_dist_emulated, one rank without mpirun), whose device has the
    # memory the machine has available: 64 MiB, less than the plan's fixed buffers alone (96 MiB).
    if not DIST_EMULATED:
        pytest.skip("SYMPRUNE_DIST_EMULATED_BIN is not set (ctest sets it in MPI builds)")
    case = calib_prune(env, tmp, env.first, *CALIB, "--device", "cuda", "--comm", "mpi")
    case.binary, case.args = DIST_EMULATED, case.args[1:]  # symprune_dist takes prune's options only
    # Under scripts/sanitize.sh, no leak report: Open MPI leaves its allocations (from plugins it has
    # unloaded, so no suppression can name them) at MPI_Finalize. ASan's other checks stay on.
    case.env = {"SYMPRUNE_MEMORY_AVAILABLE": str(64 << 20),
                "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"}
    return case


@trigger("E-OPT-DEVICE-UNAVAILABLE")
def _(env, tmp):
    # No device visible, on a GPU machine too.
    case = prune(env, tmp, "--device", "cuda")
    case.env = {"CUDA_VISIBLE_DEVICES": ""}
    return case


@trigger("E-OPT-RECON-TOKENS")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, *CALIB, "--recon-tokens", "-1")


@trigger("E-OPT-MICRO-BATCH")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, *CALIB, "--micro-batch", "-3")


@trigger("E-OPT-SEED-RANGE")
def _(env, tmp):
    return prune(env, tmp, "--seed", str(-(2 ** 64)), method=("--method", "wanda", "--sparsity", "0.5"))


@trigger("E-OPT-THREADS")
def _(env, tmp):
    return prune(env, tmp, "--threads", "100000")


# --- recipes ---------------------------------------------------------------------------------------

@trigger("E-RECIPE-UNKNOWN-KEY")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nsparsity = 0.5\nsparsty = 0.6\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-TOML-SYNTAX")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-YAML-SYNTAX")
def _(env, tmp):
    (tmp / "recipe.yaml").write_text("method: [magnitude\nsparsity: 0.5\n")
    return prune(env, tmp, "--recipe", tmp / "recipe.yaml", method=())


@trigger("E-RECIPE-DUPLICATE")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nsparsity = 0.5\nmethod = "wanda"\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-BAD-VALUE")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nsparsity = "lots"\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-LIST")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nsparsity = [0.3, 0.7]\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-EXCLUSIVE")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nsparsity = 0.5\nnm = "2:4"\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-NOT-SETTABLE")
def _(env, tmp):
    (tmp / "base.toml").write_text('method = "magnitude"\n')
    (tmp / "recipe.toml").write_text(f'recipe = "{tmp / "base.toml"}"\nsparsity = 0.5\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", method=())


@trigger("E-RECIPE-YAML-NO-VALUE")
def _(env, tmp):
    (tmp / "recipe.yaml").write_text("method: magnitude\nsparsity:\n")
    return prune(env, tmp, "--recipe", tmp / "recipe.yaml", method=())


@trigger("E-RECIPE-YAML-SECOND-DOCUMENT")
def _(env, tmp):
    (tmp / "recipe.yaml").write_text("method: magnitude\n---\nsparsity: 0.5\n")
    return prune(env, tmp, "--recipe", tmp / "recipe.yaml", method=())


@trigger("E-RECIPE-GROUP-WITHOUT-SPARSITY")
def _(env, tmp):
    (tmp / "recipe.toml").write_text('method = "magnitude"\nnm = "2:4"\n')
    return prune(env, tmp, "--recipe", tmp / "recipe.toml", "--group", "layer", method=())


# --- output ----------------------------------------------------------------------------------------

@trigger("E-OUT-MISSING")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5")


@trigger("E-OUT-EXISTS")
def _(env, tmp):
    (tmp / "existing").mkdir()
    (tmp / "existing" / "keep.txt").write_text("user data")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "existing")


@trigger("E-OUT-NOT-DIRECTORY")
def _(env, tmp):
    (tmp / "file").write_text("user data")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out", tmp / "file")


@trigger("E-OUT-INSIDE-INPUT")
def _(env, tmp):
    model = copy_model(env, tmp)
    return Case("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out", model / "pruned")


@trigger("E-OUT-CONTAINS-INPUT")
def _(env, tmp):
    model = copy_model(env, tmp)
    return Case("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out", tmp)


@trigger("E-OUT-PARENT-MISSING")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "a" / "b" / "pruned")


@trigger("E-OUT-PARENT-NOT-DIRECTORY")
def _(env, tmp):
    (tmp / "file").write_text("user data")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "file" / "pruned")


def read_only_directory(tmp):
    """tmp/ro bind-mounted read-only (as root only a read-only file system refuses writes); returns it and
    the function that unmounts it. Skips where mounting is not allowed."""
    point = tmp / "ro"
    point.mkdir()
    if subprocess.run(["mount", "--bind", point, point], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    unmount = lambda: subprocess.run(["umount", point], check=True)  # noqa: E731
    if subprocess.run(["mount", "-o", "remount,bind,ro", point], capture_output=True).returncode != 0:
        unmount()
        pytest.skip("cannot remount read-only here")
    return point, unmount


@trigger("E-OUT-UNWRITABLE")
def _(env, tmp):
    point, unmount = read_only_directory(tmp)
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                point / "pruned", cleanup=unmount)


@trigger("E-OUT-MOUNT-POINT")
def _(env, tmp):
    point = tmp / "scratch"
    point.mkdir()
    if subprocess.run(["mount", "--bind", point, point], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out", point,
                cleanup=lambda: subprocess.run(["umount", point], check=True))


@trigger("E-OUT-ROOT")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out", "/")


@trigger("E-OUT-IS-CWD")
def _(env, tmp):
    (tmp / "here").mkdir()
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out", ".",
                cwd=tmp / "here")


@trigger("E-OUT-DISK-FULL")
def _(env, tmp):
    (tmp / "out").mkdir()
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "out" / "pruned", fsize=64 << 10)


@trigger("E-REPORT-DIR-MISSING")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.second, "--seqlen", "64", "--max-chunks", "2",
                "--report", tmp / "no_such_dir" / "report.json")


@trigger("E-OUT-IS-INPUT")
def _(env, tmp):
    (tmp / "calib.txt").write_text(env.first.read_text()[:20000])
    return Case("prune", "--model", env.model, "--method", "wanda", "--sparsity", "0.5", *CALIB,
                "--calib", tmp / "calib.txt", "--out", tmp / "calib.txt")


@trigger("E-OUT-LOCK-IS-INPUT")
def _(env, tmp):
    (tmp / ".pruned.lock").write_text(env.first.read_text()[:20000])  # a calibration text under the lock's name
    return Case("prune", "--model", env.model, "--method", "wanda", "--sparsity", "0.5", *CALIB,
                "--calib", tmp / ".pruned.lock", "--out", tmp / "pruned")


@trigger("E-OUT-TEMPORARY-IS-INPUT")
def _(env, tmp):
    (tmp / ".pruned.tmp-abc123").write_text(env.first.read_text()[:20000])
    return Case("prune", "--model", env.model, "--method", "wanda", "--sparsity", "0.5", *CALIB,
                "--calib", tmp / ".pruned.tmp-abc123", "--out", tmp / "pruned")


@trigger("E-OUT-NOT-SYMPRUNE")
def _(env, tmp):
    (tmp / "work" / "src").mkdir(parents=True)
    (tmp / "work" / "src" / "main.cc").write_text("int main() {}")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "work", "--force")


@trigger("E-OUT-LOCKED")
def _(env, tmp):
    # Another run holds the output's lock for the whole of this one.
    lock = open(tmp / ".pruned.lock", "w")
    lock.write("pid 4242\n")
    lock.flush()
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", cleanup=lock.close)


def held_lock(path):
    """A lock file held as a running run holds it (closed by the case's cleanup)."""
    lock = open(path, "w")
    lock.write("pid 4242\n")
    lock.flush()
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return lock


@trigger("E-OUT-FORCE-RUNNING")
def _(env, tmp):
    # An earlier output that another run, still running, keeps its checkpoint in.
    out = tmp / "pruned"
    out.mkdir()
    (out / "symprune_provenance.json").write_text(json.dumps({"tool": "symprune"}))
    (out / "run.h5").write_bytes(b"checkpoint")
    lock = held_lock(out / ".run.h5.lock")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out", out,
                "--force", cleanup=lock.close)


@trigger("E-OUT-FILE-LOCKED")
def _(env, tmp):
    # --report names another running run's checkpoint.
    (tmp / "run.h5").write_bytes(b"checkpoint")
    lock = held_lock(tmp / ".run.h5.lock")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--report", tmp / "run.h5", cleanup=lock.close)


@trigger("E-OUT-DANGLING-LINK")
def _(env, tmp):
    (tmp / "pruned").symlink_to(tmp / "scratch" / "pruned")
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned")


@trigger("E-OUT-NAME-TOO-LONG")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / ("p" * 250))


@trigger("E-REPORT-INSIDE-INPUT")
def _(env, tmp):
    model = copy_model(env, tmp)
    return Case("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--report", model / "config.json")


@trigger("E-REPORT-IS-INPUT")
def _(env, tmp):
    (tmp / "calib.txt").write_text(env.first.read_text()[:20000])
    return Case("prune", "--model", env.model, "--method", "wanda", "--sparsity", "0.5", *CALIB,
                "--calib", tmp / "calib.txt", "--out", tmp / "pruned", "--report", tmp / "calib.txt")


@trigger("E-REPORT-INSIDE-OUT")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--report", tmp / "pruned" / "report.json")


@trigger("E-REPORT-IS-DIRECTORY")
def _(env, tmp):
    (tmp / "reports").mkdir()
    return Case("eval", "--model", env.model, "--text", env.second, "--seqlen", "64", "--max-chunks", "2",
                "--report", tmp / "reports")


@trigger("E-REPORT-NOT-REGULAR")
def _(env, tmp):
    os.mkfifo(tmp / "fifo")  # as /dev/null would be, without touching the system's
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--report", tmp / "fifo")


@trigger("E-REPORT-LINK-NOT-REGULAR")
def _(env, tmp):
    os.mkfifo(tmp / "fifo")
    (tmp / "report.json").symlink_to(tmp / "fifo")  # a link stands for its target, here not a file
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--report", tmp / "report.json")


@trigger("E-REPORT-IS-CHECKPOINT")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--checkpoint", tmp / "run.h5", "--report", tmp / "run.h5.done")


# --- Checkpoints ---------------------------------------------------------------------------------

def checkpointed(env, tmp, *extra, fault=None):
    """A magnitude prune with --checkpoint tmp/run.h5; with `fault`, run now and killed there."""
    args = ["prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
            tmp / "pruned", "--checkpoint", tmp / "run.h5", *extra]
    if fault:
        proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                              env={**os.environ, "SYMPRUNE_FAULT": fault})
        assert proc.returncode == 137 and (tmp / "run.h5").exists(), proc.stderr
        for stale in (".pruned.lock", ".run.h5.lock", "run.h5.tmp"):  # what a later run cleans up
            (tmp / stale).unlink(missing_ok=True)
    return args


@trigger("E-CKPT-EVERY")
def _(env, tmp):
    return Case(*checkpointed(env, tmp, "--checkpoint-every", "0"))


@trigger("E-CKPT-AUTO-NEEDS-FILE")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--resume", "auto")


@trigger("E-CKPT-EXISTS")
def _(env, tmp):
    return Case(*checkpointed(env, tmp, fault="block:3:exit=137"))


@trigger("E-CKPT-IS-DIRECTORY")
def _(env, tmp):
    (tmp / "run.h5").mkdir()
    return prune(env, tmp, "--checkpoint", tmp / "run.h5")


@trigger("E-CKPT-COMPANION-IS-INPUT")
def _(env, tmp):
    (tmp / "run.h5.tmp").write_text(env.first.read_text()[:20000])  # the checkpoint's staging name
    return Case("prune", "--model", env.model, "--method", "wanda", "--sparsity", "0.5", *CALIB,
                "--calib", tmp / "run.h5.tmp", "--out", tmp / "pruned", "--checkpoint", tmp / "run.h5")


@trigger("E-CKPT-UNWRITABLE")
def _(env, tmp):
    (tmp / "run.h5.tmp").mkdir()  # where the checkpoint is staged
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--checkpoint", tmp / "run.h5")


@trigger("E-REPORT-DIR-UNWRITABLE")
def _(env, tmp):
    point, unmount = read_only_directory(tmp)
    return Case("eval", "--model", env.model, "--text", env.second, "--seqlen", "64", "--max-chunks", "2",
                "--report", point / "report.json", cleanup=unmount)


@trigger("E-CKPT-DISK-FULL")
def _(env, tmp):
    return Case(*checkpointed(env, tmp), env={"SYMPRUNE_DISK_AVAILABLE": "1000"})


@trigger("E-CKPT-MISSING")
def _(env, tmp):
    return Case("prune", "--model", env.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                tmp / "pruned", "--resume", tmp / "missing.h5")


@trigger("E-CKPT-OTHER-RUN")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto", fault="block:3:exit=137")
    args[args.index("0.5")] = "0.6"
    return Case(*args)


@trigger("E-CKPT-UNUSABLE")
def _(env, tmp):
    (tmp / "run.h5").write_text("not a checkpoint")
    return Case(*checkpointed(env, tmp, "--resume", "auto"))


@trigger("E-CKPT-UNREADABLE")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto", fault="block:3:exit=137")
    (tmp / "run.h5").chmod(0)
    case = Case(*args)
    if os.geteuid() == 0:  # root reads any file: without the capabilities that let it
        wrapper = tmp / "without_dac_override.sh"
        wrapper.write_text(f'#!/bin/sh\nexec setpriv --bounding-set=-dac_override,-dac_read_search {BIN} "$@"\n')
        wrapper.chmod(0o755)
        case.binary = wrapper
    return case


@trigger("E-CKPT-MARKER-OTHER-RUN")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto")
    subprocess.run([BIN, *map(str, args)], capture_output=True, check=True)
    shutil.rmtree(tmp / "pruned")
    args[args.index("0.5")] = "0.6"
    return Case(*args)


@trigger("E-CKPT-MARKER-NO-OUTPUT")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto")
    subprocess.run([BIN, *map(str, args)], capture_output=True, check=True)
    shutil.rmtree(tmp / "pruned")  # the finished run's output is gone
    return Case(*args)


@trigger("E-CKPT-MARKER-NO-REPORT")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto")
    subprocess.run([BIN, *map(str, args), "--report", tmp / "first.json"], capture_output=True, check=True)
    return Case(*args, "--report", tmp / "second.json")  # the same finished run, another report


@trigger("E-CKPT-MARKER-CORRUPT")
def _(env, tmp):
    args = checkpointed(env, tmp, "--resume", "auto")
    (tmp / "run.h5.done").write_text("finished, honest\n")
    return Case(*args)


def test_inspect_names_a_corrupt_marker_as_prune_does(env, tmp_path):
    marker = tmp_path / "run.h5.done"
    marker.write_text("{not json\n")
    proc = run_case(Case("inspect", marker))
    assert proc.returncode == 1, proc.stderr
    assert message_regex(CATALOG["E-CKPT-MARKER-CORRUPT"]).search(proc.stderr), proc.stderr


# --- llama2.c checkpoints --------------------------------------------------------------------------

def convert(env, tmp, checkpoint):
    (tmp / "out").mkdir()
    return Case("convert-llama2c", "--checkpoint", checkpoint, "--tokenizer",
                env.data / "stories260K" / "tok512.bin", "--out", tmp / "out" / "converted")


@trigger("E-L2C-NOT-FOUND")
def _(env, tmp):
    return convert(env, tmp, tmp / "no_such.bin")


@trigger("E-L2C-SIZE")
def _(env, tmp):
    data = (env.data / "stories260K" / "stories260K.bin").read_bytes()
    (tmp / "cut.bin").write_bytes(data[:len(data) - 1000])
    return convert(env, tmp, tmp / "cut.bin")


@trigger("E-L2C-HEADER")
def _(env, tmp):
    data = bytearray((env.data / "stories260K" / "stories260K.bin").read_bytes())
    data[8:12] = struct.pack("<i", 0)  # n_layers
    (tmp / "bad.bin").write_bytes(bytes(data))
    return convert(env, tmp, tmp / "bad.bin")


def llama2c_v1_header(version=1, shared=1, dim=64, hidden=172, layers=5, heads=8, kv_heads=4, vocab=512,
                      seq_len=512):
    """A 256-byte llama2.c version 1 header (magic "ak42", version, 7 fields, shared flag, zero padding)."""
    head = struct.pack("<Ii7i", 0x616b3432, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    return (head + bytes([shared])).ljust(256, b"\0")


def stories_v0(env, **fields):
    """stories260K.bin (version 0: seven int32 fields, then the weights) with header `fields` replaced."""
    names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"]
    data = bytearray((env.data / "stories260K" / "stories260K.bin").read_bytes())
    for name, value in fields.items():
        at = 4 * names.index(name)
        data[at:at + 4] = struct.pack("<i", value)
    return bytes(data)


@trigger("E-L2C-TRUNCATED-HEADER")
def _(env, tmp):
    (tmp / "short.bin").write_bytes(stories_v0(env)[:20])
    return convert(env, tmp, tmp / "short.bin")


@trigger("E-L2C-VERSION")
def _(env, tmp):
    (tmp / "v3.bin").write_bytes(llama2c_v1_header(version=3))
    return convert(env, tmp, tmp / "v3.bin")


@trigger("E-L2C-SHARED-FLAG")
def _(env, tmp):
    (tmp / "flag.bin").write_bytes(llama2c_v1_header(shared=7))
    return convert(env, tmp, tmp / "flag.bin")


@trigger("E-L2C-HEADS")
def _(env, tmp):
    (tmp / "heads.bin").write_bytes(stories_v0(env, n_heads=7))  # 64 is not a multiple of 7
    return convert(env, tmp, tmp / "heads.bin")


@trigger("E-L2C-OVERFLOW")
def _(env, tmp):
    (tmp / "huge.bin").write_bytes(stories_v0(env, dim=1 << 30, n_heads=1 << 20, n_kv_heads=1 << 20))
    return convert(env, tmp, tmp / "huge.bin")


@trigger("E-L2C-ROPE")
def _(env, tmp):
    data = bytearray(stories_v0(env))
    data[-4:] = struct.pack("<f", 0.5)  # the last sin value of the RoPE table (a shared-classifier v0 file)
    (tmp / "rope.bin").write_bytes(bytes(data))
    return convert(env, tmp, tmp / "rope.bin")


def convert_with_tokenizer(env, tmp, tokenizer):
    (tmp / "out").mkdir()
    return Case("convert-llama2c", "--checkpoint", env.data / "stories260K" / "stories260K.bin", "--tokenizer",
                tokenizer, "--out", tmp / "out" / "converted")


@trigger("E-L2C-TOKENIZER-VOCAB")
def _(env, tmp):
    return convert_with_tokenizer(env, tmp, env.data / "llama2c_tokenizer" / "tokenizer.model")  # 32000 pieces


@trigger("E-L2C-TOKENIZER-FORMAT")
def _(env, tmp):
    data = (env.data / "stories260K" / "tok512.bin").read_bytes()
    (tmp / "tok512.bin").write_bytes(data[:3000])
    return convert_with_tokenizer(env, tmp, tmp / "tok512.bin")


# --- eval ------------------------------------------------------------------------------------------

@trigger("E-EVAL-TOO-SHORT")
def _(env, tmp):
    (tmp / "tiny.txt").write_text("Once upon a time.\n")
    return Case("eval", "--model", env.model, "--text", tmp / "tiny.txt", "--seqlen", "64")


@trigger("E-EVAL-NO-TOKENIZER")
def _(env, tmp):
    return Case("eval", "--model", "synthetic:tiny-llama", "--text", env.first, "--seqlen", "64")


@trigger("E-EVAL-SEQLEN-DEFAULT")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.first)  # stories260K: max_position_embeddings 512


@trigger("E-EVAL-BATCH")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.first, "--seqlen", "64", "--batch", "-1")


@trigger("E-EVAL-JSONL")
def _(env, tmp):
    text = env.second.read_text()
    (tmp / "c4-validation.jsonl").write_text("".join(
        json.dumps({"text": text[i:i + 3000], "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com"})
        + "\n" for i in range(0, 30000, 3000)))
    return prune(env, tmp, "--eval", tmp / "c4-validation.jsonl", "--eval-seqlen", "64")


@trigger("E-EVAL-MAX-CHUNKS")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.first, "--seqlen", "64", "--max-chunks", "-1")


@trigger("E-EVAL-SEQLEN-MIN")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.second, "--seqlen", "1", "--max-chunks", "1")


@trigger("E-EVAL-TOKEN-RANGE")
def _(env, tmp):
    return Case("eval", "--model", env.model, "--text", env.second, "--seqlen", "64", "--max-chunks", "1",
                "--tokenizer", env.data / "llama2c_tokenizer" / "tokenizer.model")


@trigger("E-PRUNE-EVAL-SEQLEN-MAX")
def _(env, tmp):
    return prune(env, tmp, "--eval", env.second)  # magnitude: --seqlen (2048 by default) is not checked


@trigger("E-PRUNE-EVAL-SEQLEN")
def _(env, tmp):
    return prune(env, tmp, "--eval", env.second, "--eval-seqlen", "1", "--eval-max-chunks", "1")


@trigger("E-PRUNE-EVAL-TOKEN-RANGE")
def _(env, tmp):
    return prune(env, tmp, "--eval", env.second, "--eval-seqlen", "64", "--eval-max-chunks", "1", "--tokenizer",
                 env.data / "llama2c_tokenizer" / "tokenizer.model")


@trigger("E-LOGITS-IDS")
def _(env, tmp):
    return Case("logits", "--model", env.model, "--ids", "1,x", "--out", tmp / "logits.f32")


@trigger("E-LOGITS-TOKEN-RANGE")
def _(env, tmp):
    return Case("logits", "--model", env.model, "--ids", "1,9999", "--out", tmp / "logits.f32")


@trigger("E-INSPECT-PATH")
def _(env, tmp):
    return Case("inspect", env.model)  # a model directory without --model


@trigger("E-INSPECT-NOTHING")
def _(env, tmp):
    return Case("inspect")


@trigger("E-EVAL-NONFINITE")
def _(env, tmp):
    def overflow(tensors):
        tensors["model.layers.0.self_attn.v_proj.weight"] = np.full_like(
            tensors["model.layers.0.self_attn.v_proj.weight"], 3e38)
    model = edit_tensors(env, tmp, overflow)
    return Case("eval", "--model", model, "--text", env.second, "--seqlen", "64", "--max-chunks", "1")


@trigger("E-PRUNE-EVAL-NONFINITE")
def _(env, tmp):
    return Case("prune", "--model", head_overflowing_model(env.model, tmp / "model"), "--method", "wanda", "--sparsity", "0.5",
                "--calib", env.first, *CALIB, "--eval", env.second, "--eval-max-chunks", "1", "--out",
                tmp / "pruned")


# --- refinement ------------------------------------------------------------------------------------

def refine_prune(env, tmp, *args):
    return prune(env, tmp, "--calib", env.first, *CALIB, *args, method=("--method", "wanda", "--sparsity", "0.5"))


for _id, _args in [("E-REFINE-METHOD", ["--refine", "dsnoot"]),
                   ("E-REFINE-SKIP", ["--refine", "dsnot", "--refine-skip", "ffn"]),
                   ("E-REFINE-MAX-CYCLES", ["--refine", "dsnot", "--max-cycles=-1"]),
                   ("E-REFINE-THRESHOLD", ["--refine", "dsnot", "--refine-threshold=-0.5"]),
                   ("E-REFINE-REG-P", ["--refine", "r2dsnot", "--reg-p", "3"]),
                   ("E-REFINE-GAMMA-GROW", ["--refine", "r2dsnot", "--gamma-grow=-1e-4"]),
                   ("E-REFINE-GAMMA-PRUNE", ["--refine", "r2dsnot", "--gamma-prune=-1"]),
                   ("E-REFINE-ALPHA", ["--refine", "r2dsnot", "--refine-alpha=-0.5"])]:
    trigger(_id)(lambda env, tmp, _args=_args: refine_prune(env, tmp, *_args))


@trigger("E-OPT-ALPHA-OVERFLOW")
def _(env, tmp):
    return calib_prune(env, tmp, env.first, *CALIB, "--alpha", "1000")


@trigger("E-OPT-ALPHA-UNUSED")
def _(env, tmp):
    return prune(env, tmp, "--alpha", "2")  # magnitude


@trigger("E-REFINE-NO-CALIB")
def _(env, tmp):
    return prune(env, tmp, "--refine", "dsnot")


@trigger("E-REFINE-GUARD-WITHOUT-REFINE")
def _(env, tmp):
    return refine_prune(env, tmp, "--refine-guard")


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    s = Stories(tmp_path_factory.mktemp("stories"))
    s.data = Path(os.environ["SYMPRUNE_DATA"])
    s.digest = tree_digest(s.model)
    return s


def snapshot(root):
    """Every file (with its digest) and every directory below root, dotfiles included."""
    root = Path(root)
    entries = {str(p.relative_to(root)): "dir" for p in root.rglob("*") if p.is_dir()}
    entries.update(tree_digest(root))
    return entries


def run_case(case):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize, case.fsize))
    return subprocess.run([case.binary, *case.args], capture_output=True, text=True, cwd=case.cwd,
                          preexec_fn=limit if case.fsize else None,
                          env={**os.environ, **case.env} if case.env else None)


def test_a_shard_in_a_subdirectory_changed_during_the_run_is_noticed(env, tmp_path):
    """Only the files directly in the model directory used to be watched: a shard the index places in a
    subdirectory, overwritten during the run, gave a model of the new weights under the old ones' masks."""
    shard = "weights/model-00001-of-00001.safetensors"

    def into_subdirectory(model):
        (model / "weights").mkdir()
        (model / "model.safetensors").rename(model / shard)
        names = sorted(load_file(str(model / shard)).keys())
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))

    def touch(model):  # the shard rewritten with the same bytes: a new modification time
        stamp = (model / shard).stat()
        os.utime(model / shard, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))

    case = changed_during_run(env, tmp_path, touch, prepare=into_subdirectory)
    before = snapshot(tmp_path)
    try:
        proc = run_case(case)
    finally:
        case.cleanup()
    assert proc.returncode == 1, proc.stderr
    assert message_regex(CATALOG["E-MODEL-CHANGED-DURING-RUN"]).search(proc.stderr), proc.stderr
    assert shard in proc.stderr, proc.stderr
    assert snapshot(tmp_path) == before


def test_catalog_and_triggers_match():
    assert set(CATALOG) == set(TRIGGERS), (
        f"documented without a trigger: {sorted(set(CATALOG) - set(TRIGGERS))}; "
        f"triggers without an entry: {sorted(set(TRIGGERS) - set(CATALOG))}")


def test_catalog_ids_are_stable_names():
    for error_id in CATALOG:
        assert re.fullmatch(r"E-[A-Z0-9]+(-[A-Z0-9]+)+", error_id), error_id


@pytest.mark.parametrize("error_id", sorted(TRIGGERS))
def test_trigger(env, tmp_path, error_id):
    if error_id not in CATALOG:
        pytest.fail(f"{error_id} has a trigger but no entry in {DOC}")
    case = TRIGGERS[error_id](env, tmp_path)
    before = snapshot(tmp_path)
    try:
        proc = run_case(case)
    finally:
        if case.cleanup:
            case.cleanup()
    if os.environ.get("SYMPRUNE_CATALOG_DUMP"):
        print(f"\n[{error_id}] rc={proc.returncode}\n{proc.stderr}")
    assert proc.returncode == 1, (error_id, proc.returncode, proc.stderr)
    pattern = message_regex(CATALOG[error_id])
    assert pattern.search(proc.stderr), (error_id, CATALOG[error_id], proc.stderr)
    assert snapshot(tmp_path) == before, f"{error_id}: files were created, changed or removed"
    assert tree_digest(env.model) == env.digest, "the shared model was modified"
