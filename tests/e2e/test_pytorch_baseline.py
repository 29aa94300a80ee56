"""bench/pytorch_layerwise.py (the PyTorch baseline of the CUDA benchmark, written the way the public
tools run) is the same pipeline as symprune: on stories260K in fp32 on the CPU its masks equal
`symprune prune`'s (at most 0.01 % may differ, at near-ties of fp32 running means vs fp64 sums; today none
do)."""
import subprocess
import sys

import numpy as np
import pytest

from prune_support import SOURCE, linear_names, load_tensors, symprune

NSAMPLES, SEQLEN = 16, 64


@pytest.mark.parametrize("method,mask", [("wanda", ["--sparsity", "0.5"]), ("ria", ["--sparsity", "0.5"]),
                                         ("wanda", ["--nm", "2:4"])])
def test_pytorch_loop_masks_equal_symprune(stories, tmp_path, method, mask):
    tokens = tmp_path / "calib.u32"
    symprune("calib", "--tokenizer", stories.model, "--calib", stories.first, "--nsamples", NSAMPLES,
             "--seqlen", SEQLEN, "--seed", 0, "--out", tokens)
    proc = subprocess.run([sys.executable, SOURCE / "bench" / "pytorch_layerwise.py", "--model", stories.model,
                           "--calib-tokens", tokens, "--nsamples", str(NSAMPLES), "--seqlen", str(SEQLEN),
                           "--method", method, *mask, "--device", "cpu", "--dtype", "fp32",
                           "--save-masks", tmp_path / "masks.npz", "--json", tmp_path / "timing.json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    symprune("prune", "--model", stories.model, "--calib", stories.first, "--nsamples", NSAMPLES,
             "--seqlen", SEQLEN, "--method", method, *mask, "--out", tmp_path / "out")
    dense, pruned = load_tensors(stories.model), load_tensors(tmp_path / "out")
    torch_masks = np.load(tmp_path / "masks.npz")
    differing = total = 0
    for name in linear_names():
        block, linear = name.removeprefix("model.layers.").removesuffix(".weight").split(".", 1)
        ours = (pruned[name] == 0) & (dense[name] != 0)
        theirs = torch_masks[f"{block}.{linear}"]
        assert theirs.shape == ours.shape, name
        differing += int((ours != theirs).sum())
        total += int(theirs.sum())
    print(f"{method} {mask}: {differing} of {total} pruned weights differ")
    assert total > 0 and differing <= 1e-4 * total
