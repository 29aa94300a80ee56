"""PyTorch checkpoints in (pytorch_model.bin, or shards with pytorch_model.bin.index.json), safetensors out.

The files are written by torch.save and by transformers' save_pretrained(safe_serialization=False), exactly as
models on the Hub ship them. symprune reads them without running their pickle, so:
- `inspect` lists the same tensors (names, dtypes, shapes) as for the safetensors save of the same model;
- a prune of the PyTorch copy of stories260K writes the same model.safetensors, byte for byte, as a prune of
  the safetensors original (same tensor order), with the same masks and perplexities;
- a sharded checkpoint comes out as model-0000i-of-0000n.safetensors with model.safetensors.index.json, that
  transformers loads, and none of the pickle files is copied;
- tied storages (an lm_head sharing the embedding's) and strided views (a transposed tensor) read right;
- the fingerprint in the report follows the .bin files' contents.
Refusals (a pickle that would run code, legacy files, training checkpoints, truncation) are in
test_error_catalog.py."""
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

from prune_support import symprune

SMALL_JOB = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "8", "--seqlen", "128"]


def stored_order(path):
    """Tensor names of a safetensors file in data-offset order."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda name: header[name]["data_offsets"][0])


def as_torch_copy(model_dir, out_dir, transform=None):
    """`model_dir` (safetensors) with its weights as pytorch_model.bin, in the file's tensor order."""
    out_dir = Path(out_dir)
    out_dir.mkdir()
    for f in Path(model_dir).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (out_dir / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(Path(model_dir) / "model.safetensors"))
    state = {name: weights[name] for name in stored_order(Path(model_dir) / "model.safetensors")}
    if transform:
        state = transform(state)
    torch.save(state, out_dir / "pytorch_model.bin")
    return out_dir


def prune(stories, model, out, *extra):
    symprune("prune", "--model", model, *SMALL_JOB, "--calib", stories.first, "--eval", stories.second,
             "--eval-max-chunks", "4", "--out", out, "--report", f"{out}.json", *extra)
    return json.loads(Path(f"{out}.json").read_text())


def test_prune_of_a_torch_copy_writes_the_same_bytes(stories, tmp_path):
    torch_dir = as_torch_copy(stories.model, tmp_path / "pt")
    a = prune(stories, stories.model, tmp_path / "from-safetensors")
    b = prune(stories, torch_dir, tmp_path / "from-torch")
    assert (tmp_path / "from-safetensors" / "model.safetensors").read_bytes() == \
        (tmp_path / "from-torch" / "model.safetensors").read_bytes()
    assert a["perplexity"] == b["perplexity"]
    assert [l["pruned"] for l in a["layers"]] == [l["pruned"] for l in b["layers"]]
    # The pickle is not copied; everything else the directory holds is.
    out_files = sorted(p.name for p in (tmp_path / "from-torch").iterdir())
    assert "pytorch_model.bin" not in out_files and "model.safetensors" in out_files
    assert {"config.json", "tokenizer.json"} <= set(out_files)
    # transformers reads the pruned copy (it needs the "format" metadata).
    with safe_open(str(tmp_path / "from-torch" / "model.safetensors"), "pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    # The fingerprint is the .bin file's, not the safetensors original's.
    assert a["fingerprints"]["model"] != b["fingerprints"]["model"]


def test_fingerprint_follows_the_weights(stories, tmp_path):
    def fingerprint(model):
        report = tmp_path / "fp.json"
        symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                 tmp_path / f"out-{model.name}", "--report", report)
        return json.loads(report.read_text())["fingerprints"]["model"]

    first = as_torch_copy(stories.model, tmp_path / "a")
    changed = as_torch_copy(stories.model, tmp_path / "b",
                            lambda s: {k: (v * 2 if k.endswith("q_proj.weight") else v) for k, v in s.items()})
    assert fingerprint(first) != fingerprint(changed)


def test_tied_storage_and_strided_views_read_right(stories, tmp_path):
    def views(state):
        out = dict(state)
        # The LM head as a second view of the embedding's storage (tied weights as torch saves them), and a
        # projection stored transposed: a strided view of a [in, out] storage.
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
        q = out["model.layers.0.self_attn.q_proj.weight"]
        out["model.layers.0.self_attn.q_proj.weight"] = q.t().contiguous().t()
        assert not out["model.layers.0.self_attn.q_proj.weight"].is_contiguous()
        return out

    torch_dir = as_torch_copy(stories.model, tmp_path / "pt", views)
    symprune("prune", "--model", torch_dir, "--method", "magnitude", "--sparsity", "0", "--out", tmp_path / "out")
    original = load_file(str(stories.model / "model.safetensors"))
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(written["lm_head.weight"], original["model.embed_tokens.weight"])
    for name, tensor in original.items():
        assert torch.equal(written[name], tensor), name


def hf_save(model_cls, config, out, dtype, **options):
    torch.manual_seed(0)
    model = model_cls(config).to(dtype)
    model.save_pretrained(out / "pt", safe_serialization=False, **options)
    model.save_pretrained(out / "st", safe_serialization=True, **options)
    return out / "pt", out / "st"


def table(model_dir):
    result = symprune("inspect", "--model", model_dir)
    rows = [line.split() for line in result.stdout.splitlines()]
    return result.stdout, {r[0]: (r[1], r[2:-1]) for r in rows if len(r) >= 4 and r[0].endswith(("weight", "bias"))}


@pytest.mark.parametrize("family,dtype", [("llama", torch.bfloat16), ("llama", torch.float32), ("opt", torch.float16)])
def test_transformers_checkpoints_inspect_like_their_safetensors(tmp_path, family, dtype):
    if family == "llama":
        config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        pt, st = hf_save(LlamaForCausalLM, config, tmp_path, dtype)
    else:
        config = OPTConfig(vocab_size=96, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=128, word_embed_proj_dim=32)
        pt, st = hf_save(OPTForCausalLM, config, tmp_path, dtype)
    assert (pt / "pytorch_model.bin").exists()
    out_pt, rows_pt = table(pt)
    _, rows_st = table(st)
    # torch.save keeps a tied lm_head (a view of the embedding's storage), safetensors drops it.
    tied = "lm_head.weight" in rows_pt and "lm_head.weight" not in rows_st
    assert not tied or rows_pt.pop("lm_head.weight") == rows_pt[[k for k in rows_pt if "embed_tokens" in k][0]]
    assert rows_pt and rows_pt == rows_st
    assert "a PyTorch checkpoint, read without running its code" in out_pt
    assert "check: ok" in out_pt


def test_sharded_checkpoint_prunes_to_sharded_safetensors(tmp_path):
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    pt, st = hf_save(LlamaForCausalLM, config, tmp_path, torch.float32, max_shard_size="60KB")
    bins = sorted(p.name for p in pt.glob("pytorch_model-*.bin"))
    assert len(bins) > 2 and (pt / "pytorch_model.bin.index.json").exists()
    out_pt, _ = table(pt)
    assert f"weights: {len(bins)} file(s) via pytorch_model.bin.index.json" in out_pt
    assert bins[-1] in out_pt
    for source in (pt, st):
        symprune("prune", "--model", source, "--method", "magnitude", "--sparsity", "0.5", "--out",
                 tmp_path / f"out-{source.name}")
    written = tmp_path / "out-pt"
    names = sorted(p.name for p in written.iterdir())
    assert not any(n.startswith("pytorch_model") for n in names), names
    assert [n.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
            for n in names if n.endswith(".safetensors")] == bins
    index = json.loads((written / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(written / shard)))
    assert set(index["weight_map"]) == set(tensors)
    # The same pruned weights as the prune of the safetensors save.
    expected = {}
    for shard in (tmp_path / "out-st").glob("*.safetensors"):
        expected.update(load_file(str(shard)))
    assert set(expected) == set(tensors)
    for name, tensor in expected.items():
        assert torch.equal(tensors[name], tensor), name
    # transformers loads the pruned copy.
    model = LlamaForCausalLM.from_pretrained(written)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight.detach(),
                       tensors["model.layers.0.mlp.up_proj.weight"])


def unused_tensor_copy(stories, tmp_path, tensor, name="extra"):
    """stories260K as pytorch_model.bin plus one tensor the model does not use."""
    return as_torch_copy(stories.model, tmp_path / "pt", lambda state: {**state, name: tensor})


@pytest.mark.parametrize("case", ["huge-broadcast", "small-broadcast"])
def test_broadcast_views_are_refused_before_any_allocation(stories, tmp_path, case):
    # torch.save keeps an expanded tensor as a view of its few stored values: read, it would be a tensor far
    # larger than the file (2^61 doubles from one), so the reader refuses it when the file is opened.
    tensor = (torch.tensor([1.0], dtype=torch.float64).as_strided((2 ** 61 + 1,), (0,)) if case == "huge-broadcast"
              else torch.zeros(4).expand(1000, 4))
    model = unused_tensor_copy(stories, tmp_path, tensor)
    result = symprune("inspect", "--model", model, check=False)
    assert result.returncode == 1, result.stderr
    assert "tensor 'extra': a view of" in result.stderr and "save it with .contiguous()" in result.stderr


def test_empty_and_unused_tensors_pass_through(stories, tmp_path):
    model = unused_tensor_copy(stories, tmp_path, torch.zeros(0, 2 ** 40))
    symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out", tmp_path / "out")
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert tuple(written["extra"].shape) == (0, 2 ** 40)


@pytest.mark.parametrize("name", ["__metadata__", ""])
def test_tensor_names_a_safetensors_file_cannot_hold_are_refused_at_open(stories, tmp_path, name):
    model = unused_tensor_copy(stories, tmp_path, torch.zeros(2), name)
    result = symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                      tmp_path / "out", check=False)
    assert result.returncode == 1 and "which a model cannot have" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_an_index_shard_that_would_become_model_safetensors_is_refused(stories, tmp_path):
    model = as_torch_copy(stories.model, tmp_path / "pt")
    (model / "pytorch_model.bin").rename(model / "model.bin")
    state = torch.load(model / "model.bin")
    (model / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {k: "model.bin" for k in state}}))
    result = symprune("inspect", "--model", model, check=False)
    assert result.returncode == 1 and "would be written as model.safetensors" in result.stderr, result.stderr


def test_shards_in_a_subdirectory_are_read_written_and_fingerprinted(stories, tmp_path):
    # An index may place its shards anywhere inside the directory: the pruned copy keeps the layout
    # (shards/part-0000i.safetensors), and the fingerprint follows their contents.
    def build(root, scale):
        model = as_torch_copy(stories.model, root)
        state = torch.load(model / "pytorch_model.bin")
        (model / "pytorch_model.bin").unlink()
        (model / "shards").mkdir()
        names = sorted(state)
        weight_map = {}
        for i in range(2):
            shard = f"shards/part-{i + 1:05d}.bin"
            part = {k: (state[k] * scale if k.endswith("down_proj.weight") else state[k]) for k in names[i::2]}
            torch.save(part, model / shard)
            weight_map.update({k: shard for k in part})
        (model / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return model

    def prune_and_fingerprint(model, out):
        symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out", out,
                 "--report", f"{out}.json")
        return json.loads(Path(f"{out}.json").read_text())["fingerprints"]["model"]

    first = prune_and_fingerprint(build(tmp_path / "a", 1), tmp_path / "out-a")
    second = prune_and_fingerprint(build(tmp_path / "b", 2), tmp_path / "out-b")
    assert first != second
    written = tmp_path / "out-a"
    assert sorted(p.name for p in (written / "shards").iterdir()) == ["part-00001.safetensors",
                                                                      "part-00002.safetensors"]
    index = json.loads((written / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"shards/part-00001.safetensors", "shards/part-00002.safetensors"}
    pruned = {}
    for shard in (written / "shards").iterdir():
        pruned.update(load_file(str(shard)))
    symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
             tmp_path / "out-st")
    reference = load_file(str(tmp_path / "out-st" / "model.safetensors"))
    assert sorted(pruned) == sorted(reference)
    assert all(torch.equal(pruned[k], reference[k]) for k in reference)
