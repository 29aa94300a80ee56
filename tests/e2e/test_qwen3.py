"""Qwen3 (per-head RMSNorms on q and k before RoPE, heads wider than hidden / heads, configurable
attention biases), on tiny models whose weights numpy draws from a fixed seed.

Forward parity: `symprune logits` on the models saved in fp32, bf16 and fp16, against transformers'
Qwen3ForCausalLM's fp32 logits on the same (rounded) weights: max |diff| / max |ref| <= 1e-4.
Pruning: symprune's wanda and RIA 2:4 masks equal those of the numpy pipeline of prune_reference.py (whose
forward is checked against the same logits) except near-ties, and the norms and biases are copied unchanged.

transformers gained Qwen3 in 4.51, which needs torch 2; the test environment has 4.44 on Debian's torch 1.13.
So the reference logits are a committed file (data/qwen3_reference_logits.npz), written by this file run
as a script in an environment with transformers >= 4.51:

    python test_qwen3.py --write-reference

It records, per case, a digest of the weights' values, which the test checks before comparing; where the
installed transformers has Qwen3, the test also computes the reference itself and checks the file against it.
"""
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prune_reference as ref

BIN = os.environ.get("SYMPRUNE_BIN", "symprune")
TOL = 1e-4
VOCAB = 96
SEQ_LEN = 40
REFERENCE = Path(__file__).parent / "data" / "qwen3_reference_logits.npz"

# Two shapes: GQA with heads twice as wide as hidden / heads (as Qwen3-0.6B's: q_proj [128, 64]) and
# no biases; and narrower heads with attention_bias (on q, k, v and o) and tied embeddings.
SHAPES = {
    "wide-heads": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
                       tie_word_embeddings=False),
    "bias-tied": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16, attention_bias=True,
                      tie_word_embeddings=True),
}
DTYPES = ["float32", "bfloat16", "float16"]
CASES = [f"{shape}-{dtype}" for shape in SHAPES for dtype in DTYPES]


def case_config(shape):
    return dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=VOCAB, hidden_size=64,
                intermediate_size=112, num_hidden_layers=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
                rope_theta=1000000.0, hidden_act="silu", use_sliding_window=False, sliding_window=None,
                max_window_layers=2, torch_dtype="float32", **SHAPES[shape])


def case_weights(shape, seed):
    """The model's tensors, drawn by numpy from `seed` (fp32): linears and embeddings N(0, 0.1²), norms
    1 + N(0, 0.1²) so that their handling is tested, biases N(0, 0.05²)."""
    c = case_config(shape)
    rng = np.random.RandomState(seed)
    d, f, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def normal(*size, scale=0.1):
        return (scale * rng.standard_normal(size)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(VOCAB, d), "model.norm.weight": 1 + normal(d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = 1 + normal(d)
        tensors[p + "post_attention_layernorm.weight"] = 1 + normal(d)
        for name, rows, cols in [("q_proj", q, d), ("k_proj", kv, d), ("v_proj", kv, d), ("o_proj", d, q)]:
            tensors[p + f"self_attn.{name}.weight"] = normal(rows, cols)
            if c["attention_bias"]:
                tensors[p + f"self_attn.{name}.bias"] = normal(rows, scale=0.05)
        tensors[p + "self_attn.q_norm.weight"] = 1 + normal(hd)
        tensors[p + "self_attn.k_norm.weight"] = 1 + normal(hd)
        for name, rows, cols in [("gate_proj", f, d), ("up_proj", f, d), ("down_proj", d, f)]:
            tensors[p + f"mlp.{name}.weight"] = normal(rows, cols)
    if not c["tie_word_embeddings"]:
        tensors["lm_head.weight"] = normal(VOCAB, d)
    return tensors


def write_case(case, out_dir):
    """Writes the case's model directory; returns its tensors as stored, widened to fp32."""
    import torch
    from safetensors.torch import save_file

    shape, dtype = case.rsplit("-", 1)
    seed = int.from_bytes(hashlib.sha256(case.encode()).digest()[:4], "little")
    config = case_config(shape)
    config["torch_dtype"] = dtype
    torch_dtype = getattr(torch, dtype)
    stored = {k: torch.from_numpy(v).to(torch_dtype).contiguous() for k, v in case_weights(shape, seed).items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file(stored, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {k: v.to(torch.float32).numpy() for k, v in stored.items()}


def weights_digest(tensors):
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
    return h.hexdigest()


def token_ids():
    return np.random.RandomState(5).randint(0, VOCAB, SEQ_LEN).tolist()


def transformers_logits(case, tensors):
    """Qwen3ForCausalLM's fp32 logits on `tensors` (None where the installed transformers lacks Qwen3)."""
    import torch
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        return None
    config = case_config(case.rsplit("-", 1)[0])
    config.pop("architectures"), config.pop("model_type"), config.pop("torch_dtype")
    model = Qwen3ForCausalLM(Qwen3Config(**config)).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()},
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if config["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        return model(torch.tensor([token_ids()])).logits[0].numpy().astype(np.float32)


def symprune_logits(model_dir, out):
    ids = token_ids()
    proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", ",".join(map(str, ids)),
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_qwen3(case, reference, tmp_path):
    tensors = write_case(case, tmp_path / "model")
    assert str(reference[f"{case}/digest"]) == weights_digest(tensors), "the weights are not the reference's"
    ref = reference[f"{case}/logits"].astype(np.float64)
    live = transformers_logits(case, tensors)
    if live is not None:  # the file is what this transformers computes
        assert np.abs(live - ref).max() / np.abs(ref).max() <= 1e-6
    got = symprune_logits(tmp_path / "model", tmp_path / "logits.f32").astype(np.float64)
    assert got.shape == ref.shape == (SEQ_LEN, VOCAB)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel <= TOL, f"{case}: relative max error {rel:.3e}"


def test_head_norms_matter(reference, tmp_path):
    """Guards the test above: with the q/k norms' weights set to one, the logits move far beyond the
    tolerance, so a forward pass that skipped or misapplied them would fail."""
    import torch
    from safetensors.torch import load_file, save_file
    case = "wide-heads-float32"
    write_case(case, tmp_path / "model")
    tensors = load_file(str(tmp_path / "model" / "model.safetensors"))
    for name in tensors:
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            tensors[name] = torch.ones_like(tensors[name])
    save_file(tensors, str(tmp_path / "model" / "model.safetensors"), metadata={"format": "pt"})
    got = symprune_logits(tmp_path / "model", tmp_path / "logits.f32")
    ref = reference[f"{case}/logits"]
    assert np.abs(got - ref).max() / np.abs(ref).max() > 100 * TOL


def test_reference_forward_matches_transformers_qwen3(reference, tmp_path):
    """prune_reference.Llama, the masks' reference below, computes transformers' Qwen3 (fp64 against fp32)."""
    for case in CASES:
        tensors = write_case(case, tmp_path / case)
        model = ref.Llama(case_config(case.rsplit("-", 1)[0]), {k: v.astype(np.float64) for k, v in tensors.items()})
        h = model.embed(np.array([token_ids()]))
        for i in range(model.n_layers):
            h = model.block(i, h)
        want = reference[f"{case}/logits"]
        assert np.abs(model.logits(h)[0] - want).max() / np.abs(want).max() <= 1e-5, case


NSAMPLES, CALIB_SEQLEN = 8, 64


@pytest.mark.parametrize("shape,method,sparsity,nm", [("wide-heads", "wanda", 0.5, None),
                                                      ("bias-tied", "ria", None, (2, 4))],
                         ids=["wanda-50", "ria-2:4"])
def test_masks_equal_reference_qwen3(shape, method, sparsity, nm, tmp_path):
    model_dir = tmp_path / "model"
    tensors = write_case(f"{shape}-float32", model_dir)
    stream = np.random.RandomState(7).randint(0, VOCAB, 3000).astype("<u4")
    stream.tofile(tmp_path / "calib.bin")
    # Token-file windows start at randint(0, L - T - 1) of Python's random seeded with --seed.
    random.seed(0)
    starts = [random.randint(0, len(stream) - CALIB_SEQLEN - 1) for _ in range(NSAMPLES)]
    windows = np.stack([stream[s:s + CALIB_SEQLEN] for s in starts]).astype(np.int64)

    out = tmp_path / "pruned"
    args = [BIN, "prune", "--model", model_dir, "--method", method, "--calib", tmp_path / "calib.bin",
            "--calib-format", "tokens-u32", "--nsamples", NSAMPLES, "--seqlen", CALIB_SEQLEN, "--seed", 0,
            "--recon-tokens", 0, "--out", out, "--report", tmp_path / "report.json"]
    args += ["--sparsity", sparsity] if nm is None else ["--nm", f"{nm[0]}:{nm[1]}"]
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = {f"model.layers.{layer['name']}.weight": layer
              for layer in json.loads((tmp_path / "report.json").read_text())["layers"]}

    from safetensors.numpy import load_file
    pruned = load_file(str(out / "model.safetensors"))
    assert set(pruned) == set(tensors)
    config = case_config(shape)
    model = ref.Llama(config, {k: v.astype(np.float64) for k, v in tensors.items()})
    expected = ref.prune(model, windows, method, sparsity=sparsity, nm=nm)
    assert len(expected) == 2 * 7
    disagreements = 0
    for name, (ref_mask, ref_scores, ref_recon) in expected.items():
        w = tensors[name]
        mask = pruned[name] == 0
        assert np.array_equal(pruned[name][~mask], w[~mask]), name  # kept weights untouched
        groups = mask if nm is None else mask.reshape(-1, nm[1])
        assert np.all(groups.sum(axis=1) == (w.shape[1] // 2 if nm is None else nm[0])), name
        count, not_ties, gap = ref.compare_masks(ref_mask, ref_scores, mask, nm=nm, rtol=1e-6)
        assert not_ties == 0, (name, count, gap)
        disagreements += count
        if count == 0:
            assert report[name]["recon_error"] == pytest.approx(ref_recon, rel=1e-5), name
    assert disagreements <= 2, disagreements
    # The masks are not magnitude's: a few percent of the entries differ (4.9 % for RIA 2:4, whose scores
    # already weigh |W| by its row and column sums), so a pass that got the activations wrong would show.
    changed = sum(int((ref.make_mask(np.abs(tensors[n]), sparsity, nm) != m).sum())
                  for n, (m, _, _) in expected.items())
    assert changed > 0.03 * sum(tensors[n].size for n in expected)
    for name, value in tensors.items():  # norms (the heads' too), biases, embeddings: as they were
        if name not in expected:
            assert np.array_equal(pruned[name], value), name
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"


def test_tensors_of_another_architecture_are_refused(tmp_path):
    """Qwen3's MLP has no biases (mlp_bias is not read) and its head norms are required."""
    from safetensors.numpy import load_file, save_file
    model_dir = tmp_path / "model"
    write_case("wide-heads-float32", model_dir)
    tensors = load_file(str(model_dir / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    for change, message in [
        (lambda t, c: (t.update({"model.layers.1.mlp.up_proj.bias": np.zeros(112, np.float32)}),
                       c.update(mlp_bias=True)),
         "tensor 'model.layers.1.mlp.up_proj.bias' is the bias of 'model.layers.1.mlp.up_proj.weight', but "
         "transformers' qwen3 architecture has no bias there"),
        (lambda t, c: t.pop("model.layers.0.self_attn.k_norm.weight"),
         "missing tensor 'model.layers.0.self_attn.k_norm.weight'"),
    ]:
        t, c = dict(tensors), dict(config)
        change(t, c)
        save_file(t, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        (model_dir / "config.json").write_text(json.dumps(c))
        proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", "1,2,3", "--out",
                               str(tmp_path / "l.f32")], capture_output=True, text=True)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert not (tmp_path / "l.f32").exists()


def test_inspect_names_the_head_norms(tmp_path):
    write_case("bias-tied-bfloat16", tmp_path / "model")
    proc = subprocess.run([BIN, "inspect", "--model", str(tmp_path / "model")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "family: LLaMA (qwen3)" in proc.stdout
    assert "heads: 8, kv heads: 2, head dim: 16" in proc.stdout
    assert "biases: attention, attention: full causal, q/k RMSNorm per head of 16" in proc.stdout
    assert "check: ok" in proc.stdout


def write_reference(path):
    import tempfile
    import transformers
    arrays = {"transformers_version": np.array(transformers.__version__)}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            tensors = write_case(case, Path(tmp) / case)
            logits = transformers_logits(case, tensors)
            assert logits is not None, f"transformers {transformers.__version__} has no Qwen3 (>= 4.51 needed)"
            arrays[f"{case}/digest"] = np.array(weights_digest(tensors))
            arrays[f"{case}/logits"] = logits
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size} bytes, transformers {transformers.__version__})")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-reference"]:
        sys.exit(__doc__)
    write_reference(REFERENCE)
