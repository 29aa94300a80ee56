"""Nothing lost, nothing misread: inputs that used to be refused although valid, or accepted although
garbage, on the stories260K model.

- safetensors files whose 8-byte header length begins 80 02..05 (like a pickle) are safetensors;
- text that is not UTF-8, holds NULs, is a directory, a device or a /proc file is named for what it is;
- a config that undercounts the layers is refused; unused tensors in other dtypes are copied through."""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from prune_support import BIN, Stories, shard_layout, symprune, tree_digest

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


def expect_error(proc, *parts):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    for part in parts:
        assert str(part) in proc.stderr, (part, proc.stderr)


def prune(stories, tmp_path, *args, model=None):
    return symprune("prune", "--model", model or stories.model, *args, "--out", tmp_path / "pruned", check=False)


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
    model, tensors, shards = shard_layout(stories, tmp_path)
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


# --- text that is not text -------------------------------------------------------------------------

def utf16(stories):
    return stories.second.read_text().encode("utf-16")


@pytest.mark.parametrize("name,content,parts", [
    ("utf16.txt", lambda s: s.first.read_text().encode("utf-16"),
     ["calibration file is not UTF-8 text: invalid byte 0xFF at offset 0", "UTF-16 (BOM FF FE)",
      "iconv -f UTF-16 -t UTF-8"]),
    ("zeros.txt", lambda s: b"\0" * 100000, ["calibration file is not text: NUL byte at offset 0"]),
    ("latin1.txt", lambda s: s.first.read_text()[:20000].replace("a", "\u00e0").encode("latin-1"),
     ["is not UTF-8 text: invalid byte 0xE0", "Latin-1 or Windows-1252"]),
    ("docs.jsonl", lambda s: b'{"text": "fine"}\n' + json.dumps({"text": "x"}).encode("utf-16-le") + b"\n",
     ["calibration file (line 2) is not text: NUL byte at offset 18", "UTF-16LE without a byte order mark"]),
    ("nul.jsonl", lambda s: json.dumps({"text": s.first.read_text()[:5000] + "\0"}).encode() + b"\n",
     ['calibration file (line 1, "text" field) is not text: NUL byte at offset 5000']),
])
def test_garbage_calibration_is_refused(stories, tmp_path, name, content, parts):
    calib = tmp_path / name
    calib.write_bytes(content(stories))
    expect_error(prune(stories, tmp_path, *WANDA, "--calib", calib, *CALIB), calib, *parts)
    assert not (tmp_path / "pruned").exists()


def test_garbage_evaluation_text_is_refused(stories, tmp_path):
    text = tmp_path / "utf16.txt"
    text.write_bytes(utf16(stories))
    hint = "it looks like UTF-16 (BOM FF FE); convert it with: iconv -f UTF-16 -t UTF-8"
    expect_error(symprune("eval", "--model", stories.model, "--text", text, "--seqlen", "64", "--max-chunks", "1",
                          check=False), f"{text}: text file (--text) is not UTF-8 text", hint)
    expect_error(prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", "--eval", text),
                 f"{text}: evaluation text (--eval) is not UTF-8 text", hint)
    expect_error(symprune("tokenize", "--tokenizer", stories.model, "--text-file", text, check=False),
                 f"{text}: text file (--text-file) is not UTF-8 text", hint)
    expect_error(symprune("tokenize", "--tokenizer", stories.model, "--text", os.fsdecode(b"\xff\xfe"),
                          check=False), "--text: not UTF-8: invalid byte 0xFF at offset 0")
    assert not (tmp_path / "pruned").exists()


def test_directories_and_devices_say_what_they_are(stories, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    expect_error(symprune("eval", "--model", stories.model, "--text", folder, "--seqlen", "64", check=False),
                 f"{folder}: text file (--text) is a directory, not a file")
    expect_error(prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", "--eval", folder),
                 f"{folder}: evaluation text (--eval) is a directory, not a file")
    expect_error(prune(stories, tmp_path, *WANDA, "--calib", folder, *CALIB),
                 f"{folder}: calibration file is a directory, not a file")
    expect_error(symprune("tokenize", "--tokenizer", stories.model, "--text-file", "/dev/zero", check=False),
                 "/dev/zero: text file (--text-file) is a character device")


def test_proc_files_are_read_to_the_end(stories, tmp_path):
    """/proc/version reports 0 bytes but holds a line of text: it used to be "empty"."""
    copy = tmp_path / "version.txt"
    copy.write_bytes(Path("/proc/version").read_bytes())

    def windows(path):
        out = symprune("calib", "--tokenizer", stories.model, "--calib", path, "--nsamples", "3", "--seqlen", "8",
                       "--json")
        result = json.loads(out.stdout)
        return result["stream_tokens"], result["windows"], result["fingerprint"]
    assert windows("/proc/version") == windows(copy)
    ids = symprune("tokenize", "--tokenizer", stories.model, "--text-file", "/proc/version").stdout
    assert ids == symprune("tokenize", "--tokenizer", stories.model, "--text-file", copy).stdout


def test_text_named_bin_is_not_read_as_token_ids(stories, tmp_path):
    calib = tmp_path / "stories.bin"
    calib.write_bytes(stories.first.read_bytes()[:30000])
    expect_error(prune(stories, tmp_path, *WANDA, "--calib", calib, *CALIB),
                 f"{calib}: the .bin file holds text, not uint16 token ids",
                 "give --calib-format text to tokenize it as text, or --calib-format tokens-u16")
    prune_ok = prune(stories, tmp_path, *WANDA, "--calib", calib, *CALIB, "--calib-format", "text")
    assert prune_ok.returncode == 0, prune_ok.stderr
    # Real token files are still read as such.
    tokens = tmp_path / "tokens.bin"
    np.array(json.loads(symprune("tokenize", "--tokenizer", stories.model, "--text-file", stories.first,
                                 "--json").stdout), dtype="<u2").tofile(tokens)
    shutil.rmtree(tmp_path / "pruned")
    assert prune(stories, tmp_path, *WANDA, "--calib", tokens, *CALIB).returncode == 0


# --- model structure -------------------------------------------------------------------------------

def test_config_with_fewer_layers_than_the_weights_is_refused(stories, tmp_path):
    model = shutil.copytree(stories.model, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (model / "config.json").write_text(json.dumps(config))
    message = (f"{model / 'config.json'}: num_hidden_layers is 3 but the weights hold 5 layers (tensor "
               f"'model.layers.3.input_layernorm.weight' in {model / 'model.safetensors'} is in layer 3); the "
               "layers past 3 would be left unpruned")
    expect_error(symprune("inspect", "--model", model, check=False), message)
    expect_error(prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model), message)
    assert not (tmp_path / "pruned").exists()


def test_unused_non_float_tensors_are_copied_through(stories, tmp_path):
    """An I64 position_ids and an F64 inv_freq (as some checkpoints carry, and transformers loads with a
    warning) used to make symprune refuse the whole model."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    tensors = load_file(str(model / "model.safetensors"))
    extra = {"model.position_ids": np.arange(512, dtype=np.int64)[None, :],
             "model.layers.0.self_attn.rotary_emb.inv_freq": 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)}
    assert extra["model.layers.0.self_attn.rotary_emb.inv_freq"].dtype == np.float64
    save_file({**tensors, **extra}, str(model / "model.safetensors"), metadata={"format": "pt"})

    out = symprune("inspect", "--model", model).stdout
    assert "check: ok, 47 tensors match config.json" in out and "; 2 tensor(s) not used by the model" in out
    proc = symprune("prune", "--model", model, *WANDA, "--calib", stories.first, *CALIB, "--out",
                    tmp_path / "pruned")
    for name, dtype in (("model.position_ids", "I64"), ("model.layers.0.self_attn.rotary_emb.inv_freq", "F64")):
        assert f"tensor '{name}' ({dtype}) is not used by the model: ignored, and copied unchanged" in proc.stderr
    pruned = load_file(str(tmp_path / "pruned" / "model.safetensors"))
    for name, value in extra.items():
        assert pruned[name].dtype == value.dtype and pruned[name].tobytes() == value.tobytes(), name
    assert np.count_nonzero(pruned["model.layers.0.mlp.up_proj.weight"] == 0) > 0

    script = ("import sys, torch\n"
              "from transformers import AutoModelForCausalLM\n"
              "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
              "print(m(torch.tensor([[1, 403, 407]])).logits.shape)\n")
    load = subprocess.run([sys.executable, "-c", script, str(tmp_path / "pruned")], capture_output=True, text=True)
    assert load.returncode == 0, load.stderr
    assert "torch.Size([1, 3, 512])" in load.stdout


def with_extra_tensors(stories, tmp_path, extra, **config_changes):
    model = shutil.copytree(stories.model, tmp_path / "model")
    tensors = load_file(str(model / "model.safetensors"))
    save_file({**tensors, **extra}, str(model / "model.safetensors"), metadata={"format": "pt"})
    if config_changes:
        config = json.loads((model / "config.json").read_text())
        config.update(config_changes)
        (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("extra,message", [
    # Biases without "attention_bias": true were dropped: the logits of another model, without a word.
    ({f"model.layers.0.self_attn.{p}_proj.bias": np.ones(64, np.float32) for p in "qkv"},
     "tensor 'model.layers.0.self_attn.k_proj.bias' is the bias of 'model.layers.0.self_attn.k_proj.weight', but "
     "{config} describes that linear without a bias (\"attention_bias\" is false or absent)"),
    ({"model.layers.1.mlp.down_proj.bias": np.ones(64, np.float32)}, "(\"mlp_bias\" is false or absent)"),
    # A parameter of another architecture (Qwen3's per-head norms).
    ({"model.layers.0.self_attn.q_norm.weight": np.ones(8, np.float32)},
     "tensor 'model.layers.0.self_attn.q_norm.weight' is not part of the llama model that {config} describes: "
     "the model would be computed without it"),
])
def test_float_tensors_the_config_leaves_out_are_refused(stories, tmp_path, extra, message):
    model = with_extra_tensors(stories, tmp_path, extra)
    message = message.format(config=model / "config.json")
    for command in (["logits", "--model", model, "--ids", "1,403", "--out", tmp_path / "l.f32"],
                    ["eval", "--model", model, "--text", stories.second, "--seqlen", "64"],
                    ["prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                     tmp_path / "pruned"]):
        expect_error(symprune(*command, check=False), message)
    assert not (tmp_path / "pruned").exists() and not (tmp_path / "l.f32").exists()


def test_other_unused_float_tensors_are_named_and_copied(stories, tmp_path):
    extra = {"model.extra_scale": np.full(4, 2.0, np.float32)}
    model = with_extra_tensors(stories, tmp_path, extra)
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    assert "tensor 'model.extra_scale' is not used by the model: ignored, and copied unchanged" in proc.stderr
    pruned = load_file(str(tmp_path / "pruned" / "model.safetensors"))
    assert pruned["model.extra_scale"].tobytes() == extra["model.extra_scale"].tobytes()


def test_a_stored_head_that_a_tied_config_ignores_is_refused_and_named_by_inspect(stories, tmp_path):
    """tie_word_embeddings makes the embedding the head; a stored lm_head.weight that differs from it makes the
    model ambiguous (transformers 4.44 keeps lm_head's values for both, symprune would compute with the
    embedding's), so a run refuses it and inspect names it; a copy of the embedding (the usual case) is quiet."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    assert json.loads((model / "config.json").read_text())["tie_word_embeddings"] is True
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    named = "tensor 'lm_head.weight' differs from the embedding 'model.embed_tokens.weight', but"
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0 and named not in proc.stderr, proc.stderr
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 0.5
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(tmp_path / "pruned")
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 1 and named in proc.stderr and "the model is ambiguous" in proc.stderr, proc.stderr
    assert "set tie_word_embeddings to false if 'lm_head.weight' is the model's head" in proc.stderr
    assert not (tmp_path / "pruned").exists()
    inspected = symprune("inspect", "--model", model, "--no-table")
    assert named in inspected.stderr and "a run refuses such a model" in inspected.stderr


def test_the_output_index_is_written_from_the_shards_not_copied(stories, tmp_path):
    """The input index used to be copied as it was: one without "metadata" (which transformers requires), or
    missing a tensor its shard holds, made an output index with the same defect."""
    model, tensors, shards = shard_layout(stories, tmp_path)
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in members})
    left_out = "model.norm.weight"
    partial = {name: shard for name, shard in weight_map.items() if name != left_out}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": partial}))
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    index = json.loads((tmp_path / "pruned" / "model.safetensors.index.json").read_text())
    written = {}
    for shard in shards:
        with safe_open(str(tmp_path / "pruned" / shard), "np") as f:
            written.update({name: shard for name in f.keys()})
    assert index["weight_map"] == written and left_out in written
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())


def test_an_index_beside_model_safetensors_is_not_copied(stories, tmp_path):
    """model.safetensors is read when an index and its shards sit beside it (transformers' order too): the
    output holds model.safetensors only, without the index, which would name shards it does not have."""
    model, tensors, shards = shard_layout(stories, tmp_path)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in members})
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    index = model / "model.safetensors.index.json"
    assert f"{index}: not read (the weights come from model.safetensors), not copied" in proc.stderr
    pruned = tmp_path / "pruned"
    assert (pruned / "model.safetensors").exists()
    assert not (pruned / "model.safetensors.index.json").exists()
    assert not any(pruned.glob("model-0000*.safetensors"))


def test_shards_in_a_subdirectory_are_written_there(stories, tmp_path):
    """An index may name shards in a subdirectory: they are pruned into the same place, and the warning
    says that only the weight files of that subdirectory are in the output."""
    model, tensors, shards = shard_layout(stories, tmp_path)
    (model / "weights").mkdir()
    (model / "weights" / "notes.txt").write_text("not copied")
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(model / "weights" / shard), metadata={"format": "pt"})
        weight_map.update({n: f"weights/{shard}" for n in members})
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    assert "subdirectory not copied" not in proc.stderr
    assert f"{model / 'weights'}: only the model's weight files in this subdirectory are in the pruned model" \
        in proc.stderr
    pruned = tmp_path / "pruned"
    for shard, members in shards.items():
        with safe_open(str(pruned / "weights" / shard), "np") as f:
            assert sorted(f.keys()) == sorted(members)
    assert not (pruned / "weights" / "notes.txt").exists()
    assert json.loads((pruned / "model.safetensors.index.json").read_text())["weight_map"] == weight_map


def test_a_peft_adapter_beside_the_weights_is_left_out_whole(stories, tmp_path):
    """adapter_config.json alone in the output made transformers look for the adapter's weights and fail."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    (model / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    save_file({"base_model.model.lm_head.lora_A.weight": np.zeros((4, 64), np.float32)},
              str(model / "adapter_model.safetensors"))
    (model / "adapter_model.bin").write_bytes(b"PK")
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        assert f"{model / name}: part of a PEFT adapter, which was not merged" in proc.stderr, proc.stderr
        assert not (tmp_path / "pruned" / name).exists()
    assert (tmp_path / "pruned" / "config.json").exists()


def test_files_of_the_model_directory_that_cannot_be_copied_are_named(stories, tmp_path):
    """A dangling link or a pipe among the model's other files used to be left out without a word."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    (model / "README.md").symlink_to("../blobs/missing")
    os.mkfifo(model / "events")
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    assert f"{model / 'README.md'}: a link to ../blobs/missing, which does not exist, not copied" in proc.stderr
    assert f"{model / 'events'}: not a regular file (a pipe, socket or device), not copied" in proc.stderr
    assert not (tmp_path / "pruned" / "README.md").exists() and not (tmp_path / "pruned" / "events").exists()


def test_a_dangling_index_link_beside_model_safetensors_is_not_read(stories, tmp_path):
    """model.safetensors takes precedence: a dangling index link beside it is never read, so not an error."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    (model / "model.safetensors.index.json").symlink_to("../blobs/missing")
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to("../blobs/gone")
    expect_error(prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", "--force", model=model),
                 f"{model / 'model.safetensors'} is a symbolic link to ../blobs/gone, which does not exist")


def test_an_index_naming_a_shard_two_ways_writes_it_once(stories, tmp_path):
    """"x" and "./x" in an index are one file: it used to be opened twice and written twice (the second
    write counting its zeros again), so the report gave 70 % written zeros for a 50 % prune."""
    model, tensors, shards = shard_layout(stories, tmp_path)
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
        weight_map.update({n: (f"./{shard}" if i % 2 else shard) for i, n in enumerate(members)})
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    plain = shutil.copytree(model, tmp_path / "plain")
    (plain / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: name.removeprefix("./") for n, name in weight_map.items()}}))
    reports = {}
    for name, source in (("two_ways", model), ("plain", plain)):
        symprune("prune", "--model", source, "--method", "magnitude", "--sparsity", "0.5",
                 "--out", tmp_path / f"pruned_{name}", "--report", tmp_path / f"{name}.json")
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    for shard in shards:
        assert (tmp_path / "pruned_two_ways" / shard).read_bytes() == (tmp_path / "pruned_plain" / shard).read_bytes()
    assert reports["two_ways"]["sparsity"] == reports["plain"]["sparsity"]
    assert abs(reports["two_ways"]["sparsity"]["written"] - 0.5) < 0.01, reports["two_ways"]["sparsity"]


def test_a_shard_keeps_tensors_its_index_does_not_list(stories, tmp_path):
    """The pruned shard used to lose a tensor the index left out; weight files that are not the model's are
    named and not copied."""
    model, tensors, shards = shard_layout(stories, tmp_path)
    inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq"
    weight_map = {}
    for shard, members in shards.items():
        weight_map.update({n: shard for n in members})
        if shard.startswith("model-00001"):
            tensors[inv_freq] = np.ones(4, np.float32)
            members = [*members, inv_freq]
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    (model / "model.safetensors.index.json").write_text(index)
    save_file({"w": np.ones(4, np.float32)}, str(model / "consolidated.safetensors"))

    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 0, proc.stderr
    shard = model / "model-00001-of-00002.safetensors"
    assert f"{shard}: tensor '{inv_freq}' is not listed in {model / 'model.safetensors.index.json'}" in proc.stderr
    assert f"{model / 'consolidated.safetensors'}: not one of the model's weight files, not copied" in proc.stderr
    pruned = tmp_path / "pruned"
    with safe_open(str(pruned / shard.name), "np") as f:
        assert sorted(f.keys()) == sorted([*shards[shard.name], inv_freq])
        assert f.get_tensor(inv_freq).tobytes() == np.ones(4, np.float32).tobytes()
    # The output's index is written from its shards: it lists the tensor and counts every byte.
    written = json.loads((pruned / "model.safetensors.index.json").read_text())
    assert written["weight_map"] == {**weight_map, inv_freq: shard.name}
    assert written["metadata"]["total_size"] == sum(tensors[n].nbytes for n in written["weight_map"])
    assert not (pruned / "consolidated.safetensors").exists()


def test_an_empty_evaluation_file_is_called_empty(stories, tmp_path):
    """It used to be "1 tokens, fewer than one chunk", the one token being the BOS the text does not have."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    expect_error(symprune("eval", "--model", stories.model, "--text", empty, "--seqlen", "64", check=False),
                 f"{empty}: 1 tokens, fewer than one chunk of 64 (the file is empty: the one token is the BOS)")
    expect_error(prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", "--eval", empty,
                       "--eval-seqlen", "64"), "(the file is empty: the one token is the BOS)")


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_fifo_in_place_of_the_weights_is_refused_at_once(stories, tmp_path, weights):
    """Opening a FIFO waits for a writer: the weight reader opened it so, and hung where no signal reached."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    (model / "model.safetensors").unlink()
    os.mkfifo(model / weights)
    proc = subprocess.run([BIN, "prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                           tmp_path / "pruned"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"{model / weights}: not a regular file" in proc.stderr, proc.stderr
    assert not (tmp_path / "pruned").exists()


@pytest.mark.parametrize("kind", ["dangling link", "directory", "fifo"])
def test_a_config_json_that_is_not_a_file_is_named_as_what_it_is(stories, tmp_path, kind):
    """Each used to read "model directory has no config.json", which sent users looking for a missing file."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    config = model / "config.json"
    config.unlink()
    if kind == "dangling link":
        config.symlink_to("../blobs/gone")
        said = "config.json is a link to ../blobs/gone, which does not exist (an incomplete download?)"
    elif kind == "directory":
        config.mkdir()
        said = "config.json there is a directory, not a file"
    else:
        os.mkfifo(config)
        said = "config.json there is not a regular file (a pipe, socket or device)"
    proc = subprocess.run([BIN, "prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                           tmp_path / "pruned"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"{model}: model directory has no config.json: {said}" in proc.stderr, proc.stderr


def test_a_quantized_checkpoint_is_named_as_one(stories, tmp_path):
    """A GPTQ checkpoint failed with "missing tensor ... q_proj.weight" alone, never naming its quantization."""
    model = shutil.copytree(stories.model, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (model / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(model / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj"
    tensors[f"{name}.qweight"] = tensors.pop(f"{name}.weight").view(np.int32)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    proc = prune(stories, tmp_path, "--method", "magnitude", "--sparsity", "0.5", model=model)
    assert proc.returncode == 1 and f"missing tensor '{name}.weight'" in proc.stderr, proc.stderr
    assert "config.json has a quantization_config (gptq): a quantized checkpoint stores other tensors" in proc.stderr
