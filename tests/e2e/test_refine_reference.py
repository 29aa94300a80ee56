"""`symprune prune --refine dsnot|r2dsnot` on stories260K against an independent numpy implementation
(dsnot_reference.py) of the reference description, run inside the float64 numpy pipeline of
prune_reference.py (statistics μ̃, v, a of DESIGN.md §3.1 from its own dense passes, masks applied
before its own pruned passes).

Assertions: identical masks on every linear (refined or not) and the same number of swaps per matrix,
the report's refine fields agree with the reference (mean |e| before/after), and the refinement really
moved weights (swaps > 0). symprune's statistics come from an fp32 forward, the reference's from fp64, so
a decision could in principle flip at a near-tie; none does in these cases (the test would show it).
"""
import numpy as np
import pytest

import dsnot_reference as dref
import prune_reference as ref
from prune_support import SEQLEN, linear_names, load_tensors, read_json, symprune

from conftest import REFERENCE_NSAMPLES as NSAMPLES


def skipped(skip, name):
    attention = name.startswith("self_attn.")
    return (skip == "mlp" and not attention) or (skip == "attn" and attention)


def reference_prune(model, tokens, method, opt, skip, sparsity=None, nm=None):
    """The layer-wise pipeline with refinement: {tensor name: (mask, trace or None, |e| before, after)}."""
    n_seqs, t = tokens.shape
    h = model.embed(tokens)
    result = {}
    for i in range(model.n_layers):
        stats = {}

        def observe(name, x):
            s = stats.setdefault(name, [0.0, 0.0, 0.0])
            s[0] = s[0] + x.sum(axis=0)
            s[1] = s[1] + (x * x).sum(axis=0)
            s[2] = s[2] + (x.reshape(-1, t, x.shape[1]).sum(axis=1) ** 2).sum(axis=0)

        model.block(i, h, observe=observe)
        pruned = {}
        for name in ref.LINEARS:
            w = model.linear_weight(i, name)
            in_sum, in_sumsq, in_seqsq = stats[name]
            a = np.sqrt(in_sumsq / n_seqs)
            mu = in_sum / n_seqs
            var = np.maximum((in_sumsq - in_seqsq / t) / (n_seqs * t), 0.0)
            scores = ref.scores(method, w, a)
            mask = ref.make_mask(scores, sparsity, nm)
            trace = None
            d = (w.astype(np.float32) * mu.astype(np.float32)).astype(np.float64)
            before = np.abs(np.where(mask, d, 0.0).sum(axis=1)).mean()
            if not skipped(skip, name):
                # The reference's N:M prune pick reads the initial score (magnitude and wanda are the initial
                # methods it has).
                initial = scores if method in ("magnitude", "wanda") else None
                mask, trace = dref.refine(w, mu, var, a, mask, opt, nm, initial_scores=initial)
            after = np.abs(np.where(mask, d, 0.0).sum(axis=1)).mean()
            result[f"model.layers.{i}.{name}.weight"] = (mask, trace, before, after)
            pruned[name] = np.where(mask, 0.0, w)
        h = model.block(i, h, weights=pruned)
    return result


CASES = [
    pytest.param("wanda", 0.6, None, "dsnot", [], dref.Options(), "mlp", id="wanda60-dsnot"),
    pytest.param("wanda", 0.6, None, "dsnot", ["--same-sign", "--refine-skip", "none"],
                 dref.Options(same_sign=True), "none", id="wanda60-dsnot-samesign-all"),
    pytest.param("wanda", None, (2, 4), "dsnot", ["--refine-skip", "none"], dref.Options(), "none",
                 id="wanda2:4-dsnot-all"),
    # --compat dsnot: the code's N:M prune pick, the group's smallest score whatever its sign.
    pytest.param("wanda", None, (2, 4), "dsnot", ["--refine-skip", "none", "--compat", "dsnot"],
                 dref.Options(nm_prune_any_sign=True), "none", id="wanda2:4-dsnot-all-compat"),
    # The N:M prune pick reads the initial score, |W| here (not the Wanda score).
    pytest.param("magnitude", None, (2, 4), "dsnot", ["--refine-skip", "none"], dref.Options(), "none",
                 id="magnitude2:4-dsnot-all"),
    pytest.param("ria", 0.7, None, "r2dsnot", ["--refine-skip", "none"], dref.Options(r2=True), "none",
                 id="ria70-r2dsnot-all"),
    pytest.param("wanda", 0.5, None, "r2dsnot",
                 ["--no-prune-relative", "--reg-p", "inf", "--gamma-grow", "0.05", "--gamma-prune", "0.05"],
                 dref.Options(r2=True, prune_relative=False, reg_p=np.inf, gamma_grow=0.05, gamma_prune=0.05),
                 "mlp", id="wanda50-r2dsnot-inf-gammas"),
    # Few cycles: symprune then materializes only the ends of each row's regrow order (2K+1 positions,
    # plus NaN keys) and the K smallest prune candidates of each sign; the masks must not change.
    pytest.param("wanda", 0.6, None, "dsnot", ["--refine-skip", "none", "--max-cycles", "4"],
                 dref.Options(max_cycles=4), "none", id="wanda60-dsnot-4cycles"),
    pytest.param("ria", None, (2, 4), "r2dsnot",
                 ["--refine-skip", "none", "--max-cycles", "6", "--gamma-grow", "0.5", "--reg-p", "1"],
                 dref.Options(r2=True, max_cycles=6, gamma_grow=0.5, reg_p=1.0), "none", id="ria2:4-r2dsnot-6cycles"),
]


@pytest.mark.parametrize("method,sparsity,nm,refine,flags,opt,skip", CASES)
def test_refined_masks_equal_reference(stories, reference_model, calib_tokens, tmp_path, method, sparsity, nm,
                                       refine, flags, opt, skip):
    out_dir = tmp_path / "pruned"
    args = ["prune", "--model", stories.model, "--method", method, "--out", out_dir, "--refine", refine,
            "--calib", stories.first, "--nsamples", NSAMPLES, "--seqlen", SEQLEN, "--seed", 0, *flags]
    args += ["--sparsity", sparsity] if nm is None else ["--nm", f"{nm[0]}:{nm[1]}"]
    symprune(*args, "--report", tmp_path / "report.json")
    report = {f"model.layers.{layer['name']}.weight": layer for layer in read_json(tmp_path / "report.json")["layers"]}
    pruned = load_tensors(out_dir)
    reference = reference_prune(reference_model, calib_tokens, method, opt, skip, sparsity, nm)
    assert sorted(reference) == sorted(linear_names(reference_model.n_layers))

    mismatched = {}
    total_swaps = 0
    stops = {}
    for name, (ref_mask, trace, before, after) in reference.items():
        sym_mask = pruned[name] == 0
        diff = int((sym_mask != ref_mask).sum())
        if diff:
            mismatched[name] = diff
        layer = report[name]
        if trace is None:
            assert layer["refine"] is None, name
            continue
        total_swaps += trace.swaps
        for rule, count in trace.stops.items():
            stops[rule] = stops.get(rule, 0) + count
        assert layer["refine"]["swaps"] == trace.swaps, name
        assert layer["refine"]["mean_abs_error_before"] == pytest.approx(before, rel=1e-4, abs=1e-6), name
        if not diff:
            assert layer["refine"]["mean_abs_error_after"] == pytest.approx(after, rel=1e-4, abs=1e-6), name
        # Refinement changes masks only: every row keeps its count, N:M groups stay N:M.
        assert np.array_equal(sym_mask.sum(axis=1), ref_mask.sum(axis=1)), name
    print(f"\n{method} {sparsity or nm} {refine} {flags}: {total_swaps} swaps; rows stopped by {stops}; "
          f"mismatched matrices {mismatched}")
    assert not mismatched, mismatched
    assert total_swaps > 0
