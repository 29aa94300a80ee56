"""`symprune inspect` on tiny random transformers checkpoints (LLaMA MHA/GQA/llama3 RoPE, OPT pre-/post-LN
with and without project_in/out, single-file and sharded, fp32/bf16/fp16), and on broken ones: every
failure must be a clean exit 1 with a message naming the file and the problem."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

BIN = os.environ.get("SYMPRUNE_BIN", "symprune")


def llama_config(**overrides):
    args = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    args.update(overrides)
    return LlamaConfig(**args)


def opt_config(**overrides):
    args = dict(vocab_size=96, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, word_embed_proj_dim=64, do_layer_norm_before=True)
    args.update(overrides)
    return OPTConfig(**args)


def save(model_cls, config, out_dir, dtype=torch.float32, **save_kwargs):
    torch.manual_seed(0)
    model = model_cls(config).to(dtype)
    model.save_pretrained(out_dir, safe_serialization=save_kwargs.pop("safe_serialization", True), **save_kwargs)
    return Path(out_dir)


def stored_tensors(model_dir):
    """name -> (dtype string, shape) over model.safetensors or every shard."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as handle:
            for key in handle.keys():
                t = handle.get_slice(key)
                out[key] = (t.get_dtype(), t.get_shape())
    return out


def inspect(model_arg, env=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([BIN, "inspect", "--model", str(model_arg)], capture_output=True, text=True,
                          timeout=120, env=full_env)


def expect_ok(model_dir, family):
    result = inspect(model_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    tensors = stored_tensors(model_dir)
    assert f"model: {model_dir} (path)" in out
    assert f"family: {family}" in out
    assert f"total: {len(tensors)} tensors" in out
    params = sum(int(torch.Size(shape).numel()) for _, shape in tensors.values())
    assert f"{params} parameters" in out
    assert "check: ok" in out
    # Every tensor appears in the table with its dtype and shape.
    for name, (dtype, shape) in tensors.items():
        line = next(l for l in out.splitlines() if l.split()[:1] == [name])
        assert dtype in line, line
        assert "[" + ", ".join(str(s) for s in shape) + "]" in line, line
    return out


def expect_failure(model_arg, *fragments, env=None):
    result = inspect(model_arg, env)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith("symprune: error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return result.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_llama_gqa(tmp_path, dtype):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "llama", dtype)
    out = expect_ok(d, "LLaMA")
    assert "layers: 2, hidden: 64, intermediate: 112, heads: 4, kv heads: 2, head dim: 16" in out
    assert "tied embeddings: no" in out
    assert "lm_head.weight" in out


def test_llama3_rope_scaling_tied(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    d = save(LlamaForCausalLM, llama_config(rope_theta=500000.0, rope_scaling=scaling, tie_word_embeddings=True),
             tmp_path / "llama3", torch.bfloat16)
    assert "lm_head.weight" not in stored_tensors(d)
    out = expect_ok(d, "LLaMA")
    assert "rope theta: 500000, rope scaling: llama3 (factor 8" in out
    assert "(lm_head tied to the embedding)" in out


def test_llama_sharded(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "sharded", max_shard_size="40KB")
    assert (d / "model.safetensors.index.json").exists()
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) > 2
    out = expect_ok(d, "LLaMA")
    assert f"weights: {len(shards)} file(s) via model.safetensors.index.json" in out
    assert shards[-1] in out


@pytest.mark.parametrize("pre_ln,proj", [(True, 64), (True, 32), (False, 64), (False, 32)])
def test_opt(tmp_path, pre_ln, proj):
    d = save(OPTForCausalLM, opt_config(do_layer_norm_before=pre_ln, word_embed_proj_dim=proj), tmp_path / "opt",
             torch.float16)
    out = expect_ok(d, "OPT")
    assert f"word_embed_proj_dim: {proj}" in out
    assert ("model.decoder.project_in.weight" in out) == (proj != 64)
    assert ("model.decoder.final_layer_norm.weight" in out) == pre_ln


def test_opt_sharded_without_model_prefix(tmp_path):
    # Checkpoints saved from OPTModel (as on the Hub for facebook/opt-*) use "decoder.*" names.
    d = save(OPTForCausalLM, opt_config(), tmp_path / "opt")
    tensors = load_file(str(d / "model.safetensors"))
    renamed = {k[len("model."):] if k.startswith("model.") else k: v.contiguous() for k, v in tensors.items()}
    save_file(renamed, str(d / "model.safetensors"), metadata={"format": "pt"})
    out = expect_ok(d, "OPT")
    assert "decoder.layers.1.fc2.weight" in out


def test_opt_without_model_prefix_prunes(tmp_path):
    # facebook/opt-* names ("decoder.*") through a whole activation-aware prune: the output keeps the
    # file's names, transformers loads it, and exactly the reported weights are zero.
    d = save(OPTForCausalLM, opt_config(), tmp_path / "opt", torch.float16)
    tensors = load_file(str(d / "model.safetensors"))
    renamed = {k[len("model."):] if k.startswith("model.") else k: v.contiguous() for k, v in tensors.items()}
    save_file(renamed, str(d / "model.safetensors"), metadata={"format": "pt"})
    calib = tmp_path / "calib.bin"
    torch.randint(0, 96, (4096,), generator=torch.Generator().manual_seed(1)).to(torch.int16).numpy().tofile(calib)
    out, report = tmp_path / "pruned", tmp_path / "report.json"
    result = subprocess.run([BIN, "prune", "--model", str(d), "--method", "wanda", "--sparsity", "0.5",
                             "--calib", str(calib), "--nsamples", "4", "--seqlen", "64", "--out", str(out),
                             "--report", str(report)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    pruned = load_file(str(out / "model.safetensors"))
    assert sorted(pruned) == sorted(renamed)
    layers = {layer["name"]: layer for layer in json.loads(report.read_text())["layers"]}
    assert len(layers) == 12
    for name, layer in layers.items():
        block, linear = name.split(".", 1)
        weight = pruned[f"decoder.layers.{block}.{linear}.weight"]
        assert int((weight == 0).sum()) == layer["pruned"] == weight.numel() // 2, name
    model = OPTForCausalLM.from_pretrained(out, torch_dtype=torch.float16)
    assert torch.equal(model.model.decoder.layers[0].fc1.weight, pruned["decoder.layers.0.fc1.weight"])


def test_resolves_short_names_and_cache(tmp_path):
    save(OPTForCausalLM, opt_config(), tmp_path / "models" / "opt-125m")
    result = inspect("opt-125m", env={"SYMPRUNE_MODELS": str(tmp_path / "models")})
    assert result.returncode == 0, result.stderr
    assert f"model: {tmp_path / 'models' / 'opt-125m'} ($SYMPRUNE_MODELS)" in result.stdout
    snapshot = tmp_path / "hub" / "models--facebook--opt-350m" / "snapshots" / "abc"
    save(OPTForCausalLM, opt_config(), snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc")
    result = inspect("opt-350m", env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert result.returncode == 0, result.stderr
    assert "(hf-cache facebook/opt-350m@abc)" in result.stdout


def test_not_found_lists_places(tmp_path):
    err = expect_failure("llama2-13b", "model 'llama2-13b' not found; looked in:",
                         str(tmp_path / "models" / "llama2-13b") + " (does not exist)",
                         str(tmp_path / "hub" / "models--meta-llama--Llama-2-13b-hf"),
                         env={"SYMPRUNE_MODELS": str(tmp_path / "models"), "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert "Llama-2-13b-hf" in err


def test_truncated_safetensors(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m")
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    expect_failure(d, str(path), "run past the end of the data section")
    path.write_bytes(data[:100])
    expect_failure(d, str(path), "truncated safetensors file: header length")


def test_deleted_tensor(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    expect_failure(d, "missing tensor 'model.layers.1.mlp.up_proj.weight'", str(d / "model.safetensors"),
                   str(d / "config.json"))


def test_deleted_shard(tmp_path):
    d = save(OPTForCausalLM, opt_config(), tmp_path / "m", max_shard_size="40KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (d / victim).unlink()
    expect_failure(d, str(d / "model.safetensors.index.json"), f"shard '{victim}'", "not found")


def test_config_contradicts_weights(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    config["hidden_size"] = 128
    (d / "config.json").write_text(json.dumps(config))
    expect_failure(d, "tensor 'model.embed_tokens.weight' in " + str(d / "model.safetensors"),
                   "has shape [96, 64] but " + str(d / "config.json") + " implies [96, 128]")


def test_bad_config(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(config))
    expect_failure(d, str(d / "config.json"),
                   "model_type 'gpt_neox' is not supported (supported: llama, mistral, qwen2, qwen3, opt)")
    (d / "config.json").write_text("{\"model_type\": ")
    expect_failure(d, str(d / "config.json"), "invalid JSON")


def test_pickles_other_than_pytorch_model_bin_refused(tmp_path):
    # pytorch_model.bin is read (test_torch_checkpoint.py); other pickle names are not.
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m", safe_serialization=False)
    assert (d / "pytorch_model.bin").exists() and not (d / "model.safetensors").exists()
    (d / "pytorch_model.bin").rename(d / "consolidated.00.pth")
    expect_failure(d, str(d), "found PyTorch pickle weights (consolidated.00.pth)", "safe_serialization=True")


def test_corrupt_header_does_not_crash(tmp_path):
    d = save(LlamaForCausalLM, llama_config(), tmp_path / "m")
    path = d / "model.safetensors"
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    name = "model.layers.0.self_attn.q_proj.weight"
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 4, end + 4]  # now overlaps its neighbour
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + header_len :]))
    expect_failure(d, str(path), "overlap")
