"""`symprune prune --refine`: invariants of the pruned output and the report on stories260K.

- --max-cycles 0 leaves the initial mask: the output is byte-identical to the unrefined run.
- Refinement never changes a weight value and keeps the per-row count (and the 2:4 pattern).
- --refine-skip picks the refined linears (mlp: only self_attn.*; attn: only mlp.*; none: all), and the
  report carries swaps, mean |e| before/after and the initial mask's reconstruction error, which in
  block 0 (same inputs) equals the unrefined run's reconstruction error of the same linear.
"""
import numpy as np
import pytest

from prune_support import assert_only_the_mask_changed, load_tensors, output_digest, read_json, symprune

CALIB = ["--nsamples", "16", "--seqlen", "128", "--seed", "0"]


def run(stories, out, *extra):
    symprune("prune", "--model", stories.model, "--method", "wanda", "--calib", stories.first, *CALIB,
             "--out", out, "--report", f"{out}.json", *extra)
    return load_tensors(out), {layer["name"]: layer for layer in read_json(f"{out}.json")["layers"]}


@pytest.mark.parametrize("mask", [["--sparsity", "0.6"], ["--nm", "2:4"]], ids=["60%", "2:4"])
def test_max_cycles_zero_is_the_initial_mask(stories, tmp_path, mask):
    run(stories, tmp_path / "plain", *mask)
    run(stories, tmp_path / "zero", *mask, "--refine", "r2dsnot", "--refine-skip", "none", "--max-cycles", "0")
    assert output_digest(tmp_path / "plain") == output_digest(tmp_path / "zero")


@pytest.mark.parametrize("skip,refined_prefix", [("mlp", ("self_attn.",)), ("attn", ("mlp.",)),
                                                 ("none", ("self_attn.", "mlp."))])
@pytest.mark.parametrize("mask", [["--sparsity", "0.6"], ["--nm", "2:4"]], ids=["60%", "2:4"])
def test_refinement_changes_only_the_mask(stories, tmp_path, skip, refined_prefix, mask):
    dense = load_tensors(stories.model)
    plain, plain_report = run(stories, tmp_path / "plain", *mask)
    refined, report = run(stories, tmp_path / "refined", *mask, "--refine", "dsnot", "--refine-skip", skip)
    total_swaps = 0
    for name, layer in report.items():
        key = f"model.layers.{name}.weight"
        assert_only_the_mask_changed(name, dense[key], plain[key], refined[key], (2, 4) if mask[0] == "--nm" else None)
        p, r = plain[key] == 0, refined[key] == 0
        linear = name.split(".", 1)[1]
        if linear.startswith(refined_prefix):
            info = layer["refine"]
            assert info is not None, name
            total_swaps += info["swaps"]
            # Block 0 has the same inputs in both runs (later blocks see those changed by the refined
            # blocks before them): there the plain run's mask is this run's initial mask.
            if name.startswith("0."):
                assert info["recon_error_initial"] == pytest.approx(plain_report[name]["recon_error"], rel=1e-12)
                # Each swap moves two entries (a weight pruned by one swap may be regrown by a later one).
                assert 0 < int((p != r).sum()) <= 2 * info["swaps"] or info["swaps"] == 0 and np.array_equal(p, r)
        else:
            assert layer["refine"] is None, name
            if name.startswith("0."):
                assert np.array_equal(p, r), name  # skipped linears keep the initial mask
    assert total_swaps > 0


def test_report_records_the_refinement_config(stories, tmp_path):
    run(stories, tmp_path / "r2", "--sparsity", "0.5", "--refine", "r2dsnot", "--no-grow-relative",
        "--reg-p", "inf", "--gamma-prune", "1e-3", "--same-sign")
    config = read_json(tmp_path / "r2.json")["config"]["refine"]
    assert config == {"method": "r2dsnot", "skip": "mlp", "max_cycles": 50, "guard": False, "threshold": 0.1,
                      "var_power": 1.0, "same_sign": True, "grow_relative": False, "prune_relative": True, "reg_p": "inf",
                      "gamma_grow": 0.0, "gamma_prune": 1e-3, "alpha": 0.5}
    timings = read_json(tmp_path / "r2.json")["timings"]
    assert timings["refine"] > 0
    # With N:M the prune pick is named (part of the run's identity: a checkpoint of the other rule is refused).
    run(stories, tmp_path / "nm", "--nm", "2:4", "--refine", "dsnot")
    assert read_json(tmp_path / "nm.json")["config"]["refine"]["nm_prune"] == "towards zero, else the next regrow candidate"
    run(stories, tmp_path / "nm_compat", "--nm", "2:4", "--refine", "dsnot", "--compat", "dsnot")
    assert read_json(tmp_path / "nm_compat.json")["config"]["refine"]["nm_prune"] == "smallest score (DSnoT code)"


@pytest.mark.parametrize("skip,refined", [("mlp", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                    "self_attn.out_proj"}),
                                          ("attn", {"fc1", "fc2"})])
def test_opt_skip_rules(tmp_path, skip, refined):
    # OPT names its MLP fc1/fc2 (no "mlp." prefix): DSnoT's rule is "not self_attn" (reference §5.1).
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(3)
    cfg = OPTConfig(vocab_size=128, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=256, word_embed_proj_dim=64, init_std=0.2)
    OPTForCausalLM(cfg).eval().save_pretrained(tmp_path / "opt", safe_serialization=True)
    tokens = np.random.default_rng(0).integers(0, 128, size=64 * 40).astype("<u4")
    tokens.tofile(tmp_path / "calib.bin")
    symprune("prune", "--model", tmp_path / "opt", "--method", "wanda", "--sparsity", "0.6", "--calib",
             tmp_path / "calib.bin", "--calib-format", "tokens-u32", "--nsamples", "8", "--seqlen", "64",
             "--refine", "dsnot", "--refine-skip", skip, "--out", tmp_path / "out", "--report", tmp_path / "r.json")
    layers = read_json(tmp_path / "r.json")["layers"]
    assert len(layers) == 12
    swaps = 0
    for layer in layers:
        linear = layer["name"].split(".", 1)[1]
        assert (layer["refine"] is not None) == (linear in refined), layer["name"]
        swaps += layer["refine"]["swaps"] if layer["refine"] else 0
    assert swaps > 0


def test_no_recon_error_skips_the_gram_matrices_but_not_the_masks(stories, tmp_path):
    """--no-recon-error drops the report's reconstruction errors (their Gram matrices cost about one more
    forward pass); the masks are the same. recon and --refine-guard read the Gram matrices anyway."""
    run(stories, tmp_path / "with", "--sparsity", "0.6", "--refine", "dsnot")
    _, layers = run(stories, tmp_path / "without", "--sparsity", "0.6", "--refine", "dsnot", "--no-recon-error")
    assert output_digest(tmp_path / "with") == output_digest(tmp_path / "without")
    assert all(layer["recon_error"] is None for layer in layers.values())
    assert all(layer["refine"] is None or layer["refine"]["recon_error_initial"] is None for layer in layers.values())
    assert read_json(f"{tmp_path / 'without'}.json")["config"]["recon_error"] == "off (--no-recon-error)"
    run(stories, tmp_path / "guarded", "--sparsity", "0.6", "--refine", "dsnot", "--refine-guard", "--no-recon-error")
    guarded = read_json(f"{tmp_path / 'guarded'}.json")["layers"]
    assert any(layer["refine"] and layer["refine"]["rows_reverted"] > 0 for layer in guarded)
