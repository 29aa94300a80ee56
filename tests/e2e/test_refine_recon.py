"""`symprune prune --refine recon` and `--refine-guard` on stories260K (issue 14).

- recon and guarded dsnot/r2dsnot never leave a refined matrix with a larger reconstruction error
  ‖(W−W̃)X‖/‖WX‖ than its initial mask (report: recon_error <= recon_error_initial, and the exact fp64
  change recon_sq_change <= 0), on every linear, for unstructured and 2:4 masks;
- the guard keeps, per row, either the unguarded refined row or the initial one (block 0, where both runs
  see the same inputs), and reports how many rows it restored;
- recon changes only the mask: kept weights are untouched, per-row counts and the 2:4 pattern stay;
- the report records the settings; --refine-guard works from a recipe.
"""
import numpy as np
import pytest

from prune_support import assert_only_the_mask_changed, load_tensors, read_json, symprune

CALIB = ["--nsamples", "16", "--seqlen", "128", "--seed", "0"]
MASKS = [["--sparsity", "0.6"], ["--nm", "2:4"]]
MASK_IDS = ["60%", "2:4"]


def run(stories, out, *extra):
    symprune("prune", "--model", stories.model, "--method", "wanda", "--calib", stories.first, *CALIB,
             "--out", out, "--report", f"{out}.json", *extra)
    report = read_json(f"{out}.json")
    return load_tensors(out), {layer["name"]: layer for layer in report["layers"]}, report


def pruned_masks(tensors):
    return {key: value == 0 for key, value in tensors.items() if key.endswith("_proj.weight")}


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("method", ["dsnot", "r2dsnot"])
def test_guard_never_raises_the_error(stories, tmp_path, method, mask):
    _, plain_layers, _ = run(stories, tmp_path / "plain", *mask)
    free, free_layers, _ = run(stories, tmp_path / "free", *mask, "--refine", method, "--refine-skip", "none")
    guarded, layers, report = run(stories, tmp_path / "guarded", *mask, "--refine", method, "--refine-skip", "none",
                                  "--refine-guard")
    assert report["config"]["refine"]["guard"] is True
    plain = pruned_masks(load_tensors(tmp_path / "plain"))
    reverted = rose = 0
    for name, layer in layers.items():
        info = layer["refine"]
        assert info is not None, name
        assert layer["recon_error"] <= info["recon_error_initial"], name
        assert info["recon_sq_change"] <= 0.0, name
        assert free_layers[name]["refine"]["recon_sq_change"] is None  # not computed without the guard
        assert free_layers[name]["refine"]["rows_reverted"] == 0
        reverted += info["rows_reverted"]
        rose += free_layers[name]["recon_error"] > free_layers[name]["refine"]["recon_error_initial"]
        if name.startswith("0."):  # same inputs in all three runs
            key = f"model.layers.{name}.weight"
            initial, unguarded, kept = plain[key], free[key] == 0, guarded[key] == 0
            same_as_free = (kept == unguarded).all(axis=1)
            same_as_initial = (kept == initial).all(axis=1)
            assert np.all(same_as_free | same_as_initial), name
            restored = int((~same_as_free).sum())
            assert restored == info["rows_reverted"], name
            assert info["recon_error_initial"] == pytest.approx(plain_layers[name]["recon_error"], rel=1e-12)
    assert rose > 0  # the unguarded method made matrices worse ...
    assert reverted > 0  # ... and the guard restored rows


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
def test_recon_lowers_the_error_and_changes_only_the_mask(stories, tmp_path, mask):
    dense = load_tensors(stories.model)
    plain, _, _ = run(stories, tmp_path / "plain", *mask)
    refined, layers, _ = run(stories, tmp_path / "recon", *mask, "--refine", "recon", "--refine-skip", "none")
    lower = 0
    for name, layer in layers.items():
        info = layer["refine"]
        assert info is not None, name
        assert layer["recon_error"] <= info["recon_error_initial"], name
        assert info["recon_sq_change"] <= 0.0 and info["rows_reverted"] == 0, name
        lower += layer["recon_error"] < info["recon_error_initial"] and info["swaps"] > 0
        key = f"model.layers.{name}.weight"
        assert_only_the_mask_changed(name, dense[key], plain[key], refined[key], (2, 4) if mask[0] == "--nm" else None)
    assert lower == len(layers)  # every one of the 35 linears had error left to remove


def test_report_records_recon_and_the_guard(stories, tmp_path):
    _, layers, report = run(stories, tmp_path / "recon", "--sparsity", "0.5", "--refine", "recon",
                            "--max-cycles", "7")
    assert report["config"]["refine"] == {"method": "recon", "skip": "mlp", "max_cycles": 7, "guard": False,
                                          "pool": 96, "shortlist": 8}
    refined = [layer for layer in layers.values() if layer["refine"] is not None]
    assert {layer["name"].split(".", 1)[1].split(".")[0] for layer in refined} == {"self_attn"}
    for layer in refined:
        rows = layer["shape"][0]
        assert 0 < layer["refine"]["swaps"] <= 7 * rows
        assert layer["refine"]["mean_abs_error_before"] > 0  # DSnoT's mean error, reported for recon too
    # The guard is accepted with recon and restores nothing (recon never raises a row's error).
    _, guarded_layers, guarded = run(stories, tmp_path / "recon_guard", "--sparsity", "0.5", "--refine", "recon",
                                     "--max-cycles", "7", "--refine-guard")
    assert guarded["config"]["refine"]["guard"] is True
    for name, layer in guarded_layers.items():
        assert layer["refine"] == layers[name]["refine"], name


def test_guard_from_a_recipe(stories, tmp_path):
    (tmp_path / "guard.toml").write_text('method = "wanda"\nsparsity = 0.6\nrefine = "dsnot"\nrefine-guard = true\n')
    symprune("prune", "--model", stories.model, "--recipe", tmp_path / "guard.toml", "--calib", stories.first,
             *CALIB, "--out", tmp_path / "out", "--report", tmp_path / "r.json")
    report = read_json(tmp_path / "r.json")
    assert report["config"]["refine"]["guard"] is True
    assert sum(layer["refine"]["rows_reverted"] for layer in report["layers"] if layer["refine"]) > 0
