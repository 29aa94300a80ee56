"""Every pruning method of `symprune prune` at 50 % unstructured and 2:4 on stories260K.

Calibration: 16 windows of 256 tokens from the first half of tinystories_val.txt; evaluation: the
second half, 40 chunks of 256 tokens. For each run: exit 0; every pruned linear has exactly the
requested zeros (per output row, or per group of 4 inputs) and every kept weight — and every tensor
that is not a pruned linear — is bit-identical to the input; non-weight files are byte-identical;
the input directory is unchanged; the report's sparsity.total and per-layer counts are exact; the
pruned perplexity is finite and above the dense one. For a few methods the output is loaded with
transformers' LlamaForCausalLM and its perplexity (same token ids, same chunks) equals symprune's
within 1e-4 relative.
"""
import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import LlamaForCausalLM

from prune_support import (DATA, PROVENANCE, SEQLEN, Stories, linear_names, load_tensors, read_json, symprune,
                           tree_digest)

NSAMPLES = 16
EVAL_CHUNKS = 40

# (id, method, extra options). lp: a few (p, strategy) combinations.
METHODS = [
    ("magnitude", "magnitude", []),
    ("wanda", "wanda", []),
    ("owanda", "owanda", []),
    ("symwanda", "symwanda", []),
    ("symwanda-sq", "symwanda-sq", []),
    ("symmetric", "symmetric", []),
    ("symmetric-sq", "symmetric-sq", []),
    ("ri", "ri", []),
    ("ria", "ria", []),
    ("ria-row", "ria-row", []),
    ("ria-col", "ria-col", []),
    ("lp-p1-s1", "lp", ["--p", "1", "--strategy", "1"]),
    ("lp-p2-s2", "lp", ["--p", "2", "--strategy", "2"]),
    ("lp-pinf-s3", "lp", ["--p", "inf", "--strategy", "3"]),
    ("lp-p2-s4", "lp", ["--p", "2", "--strategy", "4"]),
    ("lp-pinf-s1", "lp", ["--p", "inf", "--strategy", "1"]),
    ("stochria", "stochria", ["--beta", "0.5", "--method-seed", "7"]),
]
WEIGHT_ONLY = {"magnitude", "symmetric", "symmetric-sq", "ri"}
PATTERNS = [("50", ["--sparsity", "0.5"]), ("2:4", ["--nm", "2:4"])]
# Outputs also checked in transformers (slower): a spread of methods and both patterns.
TRANSFORMERS_CHECKED = {("wanda", "50"), ("ria", "2:4"), ("magnitude", "2:4"), ("stochria", "50"),
                        ("lp-pinf-s3", "50")}


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    s = Stories(tmp_path_factory.mktemp("stories"))
    s.digest = tree_digest(s.model)
    s.dense = load_tensors(s.model)
    return s


@pytest.fixture(scope="module")
def eval_ids(stories):
    ids = stories.eval_ids()
    assert ids[0] == 1 and len(ids) >= EVAL_CHUNKS * SEQLEN
    return ids


def transformers_perplexity(model_dir, ids):
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    losses = []
    with torch.no_grad():
        for i in range(EVAL_CHUNKS):
            chunk = torch.tensor([ids[i * SEQLEN:(i + 1) * SEQLEN]])
            logits = model(chunk).logits[0].double()
            losses.append(torch.nn.functional.cross_entropy(logits[:-1], chunk[0, 1:]).item())
    return float(np.exp(np.mean(losses)))


def check_output(stories, out_dir, nm):
    """Files, tensors and exact per-row / per-group zero counts; returns {linear: zeros} ."""
    inputs = sorted(stories.digest)
    outputs = tree_digest(out_dir)
    assert sorted(outputs) == inputs  # same files: one model.safetensors, no index, nothing extra
    for name in inputs:
        if not name.endswith(".safetensors") and name != PROVENANCE:  # this run's own provenance
            assert outputs[name] == stories.digest[name], f"{name} not copied byte-identical"
    pruned = load_tensors(out_dir)
    dense = stories.dense
    assert sorted(pruned) == sorted(dense)
    linears = set(linear_names())
    zeros = {}
    for name, w in dense.items():
        p = pruned[name]
        assert p.dtype == w.dtype and p.shape == w.shape, name
        if name not in linears:  # embeddings, norms: never pruned
            assert p.tobytes() == w.tobytes(), f"{name} changed"
            continue
        kept = p != 0
        assert np.array_equal(p[kept].view(np.uint32), w[kept].view(np.uint32)), f"{name}: kept weights changed"
        zero = ~kept
        # Per selection group: exactly the requested count, or all of the group's pre-existing zeros
        # when there are more (a zero weight scores 0 under every method, so it is pruned first).
        groups, dense_groups = (zero, w == 0) if nm is None else (zero.reshape(-1, nm[1]), (w == 0).reshape(-1, nm[1]))
        want = int(w.shape[1] * 0.5) if nm is None else nm[0]
        np.testing.assert_array_equal(groups.sum(axis=1), np.maximum(want, dense_groups.sum(axis=1)), err_msg=name)
        assert not np.any(dense_groups & ~groups), f"{name}: a dense zero became nonzero"
        zeros[name] = int(zero.sum())
    return zeros


@pytest.mark.parametrize("pattern,pattern_args", PATTERNS, ids=[p[0] for p in PATTERNS])
@pytest.mark.parametrize("case,method,options", METHODS, ids=[m[0] for m in METHODS])
def test_method(stories, eval_ids, tmp_path, case, method, options, pattern, pattern_args):
    out_dir = tmp_path / "pruned"
    report_path = tmp_path / "report.json"
    proc = symprune("prune", "--model", stories.model, "--method", method, *options, *pattern_args,
                    "--calib", stories.first, "--nsamples", NSAMPLES, "--seqlen", SEQLEN, "--seed", 0,
                    "--eval", stories.second, "--eval-max-chunks", EVAL_CHUNKS, "--out", out_dir,
                    "--report", report_path)
    assert tree_digest(stories.model) == stories.digest, "the input directory was modified"
    nm = (2, 4) if pattern == "2:4" else None
    zeros = check_output(stories, out_dir, nm)

    report = read_json(report_path)
    assert report["config"]["method"] == method and report["config"]["nsamples"] == NSAMPLES
    assert report["seed"] == 0 and report["fingerprints"]["model"]
    # Methods that read no activations run no forward pass, so no calibration data is drawn.
    uses_calibration = method not in WEIGHT_ONLY
    assert bool(report["fingerprints"].get("calibration")) == uses_calibration
    assert len(report["fingerprints"]["eval"]) == 16  # the --eval tokens', as the checkpoint records them
    assert all(("recon_error" in layer and layer["recon_error"] is not None) == uses_calibration
               for layer in report["layers"])
    timings = report["timings"]
    assert set(timings) >= {"calibration", "blocks", "dense_pass", "pruned_pass", "scores_masks", "write",
                            "eval_dense", "eval_pruned", "total"}
    # The two calibration passes, in the run and in each block; none without activations.
    for t in [timings, *report["block_timings"]]:
        assert t["blocks"] == pytest.approx(t["dense_pass"] + t["pruned_pass"], rel=1e-9, abs=1e-12)
        assert (t["dense_pass"] > 0 and t["pruned_pass"] > 0) == uses_calibration
    assert report["symprune"]["tool"] == "symprune" and report["symprune"]["commit"]
    assert report["sparsity"]["target"] == 0.5
    total = sum(stories.dense[n].size for n in zeros)
    assert report["sparsity"]["total"] == pytest.approx(sum(zeros.values()) / total, rel=1e-12, abs=0)
    assert report["sparsity"]["total"] == pytest.approx(0.5, abs=0)  # no dense zeros in stories260K
    layers = {f"model.layers.{layer['name']}.weight": layer for layer in report["layers"]}
    assert sorted(layers) == sorted(zeros)
    for name, layer in layers.items():
        w = stories.dense[name]
        assert layer["shape"] == list(w.shape)
        assert layer["pruned"] == zeros[name]
        assert layer["sparsity"] == pytest.approx(zeros[name] / w.size, rel=1e-12)

    ppl = report["perplexity"]
    assert ppl["seqlen"] == SEQLEN and ppl["chunks"] == EVAL_CHUNKS
    assert math.isfinite(ppl["dense"]) and math.isfinite(ppl["pruned"])
    assert 3.0 < ppl["dense"] < ppl["pruned"]
    for key in ("dense", "pruned"):
        m = re.search(rf"^perplexity\.{key}: (\S+)$", proc.stdout, re.M)
        assert m, proc.stdout
        assert float(m.group(1)) == pytest.approx(ppl[key], rel=1e-5)
    print(f"\n{case} {pattern}: dense {ppl['dense']:.4f} pruned {ppl['pruned']:.4f}")

    if (case, pattern) in TRANSFORMERS_CHECKED:
        expected = transformers_perplexity(out_dir, eval_ids)
        assert abs(ppl["pruned"] - expected) <= 1e-4 * expected, (ppl["pruned"], expected)


def test_dense_perplexity_matches_transformers(stories, eval_ids, tmp_path):
    report_path = tmp_path / "report.json"
    symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5",
             "--eval", stories.second, "--seqlen", SEQLEN, "--eval-max-chunks", EVAL_CHUNKS,
             "--out", tmp_path / "pruned", "--report", report_path)
    dense = read_json(report_path)["perplexity"]["dense"]
    expected = transformers_perplexity(stories.model, eval_ids)
    assert abs(dense - expected) <= 1e-4 * expected, (dense, expected)


def test_ria_equals_lp_p1_s1(stories, tmp_path):
    # The identity the paper proves (ria = lp with p = 1, strategy S1), on the whole pipeline.
    common = ["--sparsity", "0.5", "--calib", stories.first, "--nsamples", NSAMPLES, "--seqlen", SEQLEN]
    symprune("prune", "--model", stories.model, "--method", "ria", *common, "--out", tmp_path / "ria")
    symprune("prune", "--model", stories.model, "--method", "lp", "--p", "1", "--strategy", "1", *common,
             "--out", tmp_path / "lp")
    assert (tmp_path / "ria" / "model.safetensors").read_bytes() == (tmp_path / "lp" / "model.safetensors").read_bytes()


def test_sharded_fp16_input_keeps_dtype_and_shards(stories, tmp_path):
    # An fp16 copy of stories260K in two shards with an index: the output has the same shard files,
    # the same index, every tensor in fp16, kept weights bit-identical.
    model = tmp_path / "fp16-sharded"
    model.mkdir()
    for name in stories.digest:
        if not name.endswith(".safetensors"):
            (model / name).write_bytes((stories.model / name).read_bytes())
    tensors = {k: v.astype(np.float16) for k, v in stories.dense.items()}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": [n for n in names if not n.startswith("model.layers.3")
                                                   and not n.startswith("model.layers.4")]}
    shards["model-00002-of-00002.safetensors"] = [n for n in names if n not in shards["model-00001-of-00002.safetensors"]]
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(model / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in members})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    before = tree_digest(model)

    out_dir = tmp_path / "pruned"
    symprune("prune", "--model", model, "--method", "wanda", "--nm", "2:4", "--calib", stories.first,
             "--nsamples", 4, "--seqlen", SEQLEN, "--out", out_dir)
    assert tree_digest(model) == before
    after = tree_digest(out_dir)
    assert sorted(after) == sorted(before)
    assert after["config.json"] == before["config.json"]
    assert json.loads((out_dir / "model.safetensors.index.json").read_text())["weight_map"] == weight_map
    for shard, members in shards.items():
        assert sorted(load_file(str(out_dir / shard))) == sorted(members)
    pruned = load_tensors(out_dir)
    linears = set(linear_names())
    for name, w in tensors.items():
        p = pruned[name]
        assert p.dtype == np.float16 and p.shape == w.shape, name
        if name not in linears:
            assert p.tobytes() == w.tobytes(), name
            continue
        kept = p != 0
        assert np.array_equal(p[kept].view(np.uint16), w[kept].view(np.uint16)), name
        groups, dense_groups = (~kept).reshape(-1, 4), (w == 0).reshape(-1, 4)
        np.testing.assert_array_equal(groups.sum(axis=1), np.maximum(2, dense_groups.sum(axis=1)), err_msg=name)


def test_tokenizer_option_for_a_directory_without_one_and_a_synthetic_model(stories, tmp_path):
    """prune --tokenizer: a weights-only copy of the model, given the model's tokenizer, prunes to the same
    bytes and perplexities as the model itself; without it, text calibration has no tokenizer. A synthetic
    model calibrates and evaluates on text with one."""
    job = ["--method", "wanda", "--sparsity", "0.5", "--calib", stories.first, "--nsamples", 4, "--seqlen", SEQLEN,
           "--eval", stories.second, "--eval-max-chunks", 2]
    symprune("prune", "--model", stories.model, *job, "--out", tmp_path / "ref", "--report", tmp_path / "ref.json")
    bare = tmp_path / "weights-only"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(stories.model / name, bare / name)
    proc = symprune("prune", "--model", bare, *job, "--out", tmp_path / "none", check=False)
    assert proc.returncode == 1 and "no tokenizer" in proc.stderr, proc.stderr
    symprune("prune", "--model", bare, *job, "--tokenizer", stories.model / "tokenizer.bin", "--out",
             tmp_path / "bare", "--report", tmp_path / "bare.json")
    assert (tmp_path / "bare" / "model.safetensors").read_bytes() == (tmp_path / "ref" / "model.safetensors").read_bytes()
    ref, bare_report = read_json(tmp_path / "ref.json"), read_json(tmp_path / "bare.json")
    assert bare_report["perplexity"] == ref["perplexity"]
    assert bare_report["config"]["tokenizer"] == str(stories.model / "tokenizer.bin")

    report = tmp_path / "synthetic.json"
    symprune("prune", "--model", "synthetic:tiny-llama", *job, "--tokenizer", stories.model, "--report", report)
    assert read_json(report)["perplexity"]["pruned"] > 0
    # Read by nothing here: said, not silently ignored.
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--tokenizer",
                    stories.model, "--out", tmp_path / "magnitude")
    assert f"--tokenizer {stories.model} is not used" in proc.stderr


def test_each_blocks_stages_and_micro_batches_are_logged_as_they_end(stories, tmp_path):
    """At info level a stage is logged only when it took 5 s or more, and a pass's progress every 30 s (long
    blocks); --log-level debug shows every micro-batch and every stage of every block, in order, before the
    block's own line."""
    proc = symprune("--log-level", "debug", "prune", "--model", stories.model, "--method", "wanda", "--sparsity",
                    "0.5", "--refine", "dsnot", "--calib", stories.first, "--nsamples", 5, "--seqlen", SEQLEN,
                    "--micro-batch", 2, "--out", tmp_path / "out")
    blocks = read_json(stories.model / "config.json")["num_hidden_layers"]
    lines = [re.sub(r"^\[[^]]*\] ", "", line) for line in proc.stderr.splitlines()]
    for b in range(1, blocks + 1):
        prefix = f"debug block {b}/{blocks}: "
        block_lines = [re.sub(r" \(?[0-9.]+ s\)?$", "", line[len(prefix):])
                       for line in lines if line.startswith(prefix)]
        assert block_lines == [
            "dense pass: windows 2/5", "dense pass: windows 4/5", "dense pass: windows 5/5",
            "dense pass and statistics done in",
            "scores, masks and refinement done in",
            "pruned pass: windows 2/5", "pruned pass: windows 4/5", "pruned pass: windows 5/5",
            "pruned pass done in",
        ], proc.stderr
        last = max(i for i, line in enumerate(lines) if line.startswith(prefix))
        done = [i for i, line in enumerate(lines) if line.startswith(f"info block {b}/{blocks} done in ")]
        assert len(done) == 1 and last < done[0], proc.stderr
    # Short passes give no progress line at info level.
    assert not [line for line in lines if re.match(r"info block \d+/\d+: .*ETA", line)], proc.stderr
    # Writing the model: a line per shard at debug level, with the bytes of this rank's shards.
    written = [line for line in lines if line.startswith("debug writing the pruned model: ")]
    assert len(written) == 1, proc.stderr
    assert re.fullmatch(r"debug writing the pruned model: model.safetensors written, (\S+ \S+) of \1 \([0-9.]+ s\)",
                        written[0]), written


def test_pruning_a_pruned_model_reports_the_written_zeros(stories, tmp_path):
    # The masks prune 50 % of a model that is 70 % zeros already: sparsity.total and `pruned` count what
    # the masks prune, sparsity.written and each layer's `zeros` the zeros of the files written.
    symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.7",
             "--out", tmp_path / "first", "--report", tmp_path / "first.json")
    result = symprune("prune", "--model", tmp_path / "first", "--method", "magnitude", "--sparsity", "0.5",
                      "--out", tmp_path / "second", "--report", tmp_path / "second.json")
    report = read_json(tmp_path / "second.json")
    pruned = load_tensors(tmp_path / "second")
    zeros = {name: int((pruned[name] == 0).sum()) for name in linear_names()}
    for layer in report["layers"]:
        name = f"model.layers.{layer['name']}.weight"
        assert layer["pruned"] == pruned[name].size // 2, name
        assert layer["zeros"] == zeros[name], name
    params = sum(pruned[name].size for name in linear_names())
    assert report["sparsity"]["total"] == pytest.approx(0.5)
    assert report["sparsity"]["zeros"] == sum(zeros.values())
    assert report["sparsity"]["written"] == pytest.approx(sum(zeros.values()) / params)
    assert report["sparsity"]["written"] >= read_json(tmp_path / "first.json")["sparsity"]["total"] > 0.68
    assert f"sparsity.written: {sum(zeros.values()) / params:.6f}" in result.stdout
    # A dense input: the written zeros are the pruned weights (plus any weight that was zero), no extra line.
    first = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5",
                     "--out", tmp_path / "third", "--report", tmp_path / "third.json")
    third = read_json(tmp_path / "third.json")
    assert third["sparsity"]["zeros"] == sum(
        int((v == 0).sum()) for n, v in load_tensors(tmp_path / "third").items() if n in set(linear_names()))
    assert ("sparsity.written" in first.stdout) == (third["sparsity"]["zeros"] != third["sparsity"]["pruned"])


@pytest.mark.parametrize("method", ["owanda", "symwanda"])
def test_opt_output_norm_is_that_of_xwt(tmp_path, method):
    # DESIGN §2: b_r comes from Y = X Wᵀ. OPT's linears add a bias to their outputs; the statistic must not
    # see it. Block 0 of an fp32 copy of synthetic:tiny-opt, with X captured from transformers (fp64).
    from safetensors.torch import load_file as torch_load, save_file as torch_save
    from transformers import OPTForCausalLM
    symprune("prune", "--model", "synthetic:tiny-opt", "--method", "magnitude", "--sparsity", "0",
             "--out", tmp_path / "synthetic")
    model_dir = tmp_path / "opt"
    model_dir.mkdir()
    tensors = torch_load(str(tmp_path / "synthetic" / "model.safetensors"))
    torch_save({k: v.float().contiguous() for k, v in tensors.items()}, str(model_dir / "model.safetensors"),
               metadata={"format": "pt"})
    config = json.loads((tmp_path / "synthetic" / "config.json").read_text())
    config["torch_dtype"] = "float32"
    config.pop("symprune_synthetic", None)
    (model_dir / "config.json").write_text(json.dumps(config))
    np.random.default_rng(5).integers(3, 512, 4000).astype("<u4").tofile(tmp_path / "tokens.bin")
    calib = ["--calib", tmp_path / "tokens.bin", "--calib-format", "tokens-u32", "--nsamples", 4, "--seqlen", 128]
    symprune("prune", "--model", model_dir, "--method", method, "--sparsity", "0.5", *calib,
             *(["--group", "layer"] if method == "owanda" else []), "--out", tmp_path / "pruned")
    # The windows the prune read (`calib` draws them the same way).
    symprune("calib", "--tokenizer", DATA / "stories260K" / "tok512.bin", *calib, "--out", tmp_path / "windows.u32")
    windows = torch.tensor(np.fromfile(tmp_path / "windows.u32", "<u4").reshape(4, 128).astype(np.int64))
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # transformers 4.44's OPT masks overflow otherwise in fp64
    try:
        ref = OPTForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64).eval()
        layer = ref.model.decoder.layers[0]
        names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2"]
        inputs = {}
        for name in names:
            layer.get_submodule(name).register_forward_hook(
                lambda module, args, output, name=name: inputs.__setitem__(
                    name, args[0].reshape(-1, args[0].shape[-1]).numpy().copy()))
        with torch.no_grad():
            ref(windows)
    finally:
        torch.set_default_dtype(default_dtype)
    pruned = load_tensors(tmp_path / "pruned")
    for name in names:
        module = layer.get_submodule(name)
        w, x = module.weight.detach().numpy(), inputs[name]
        assert np.abs(module.bias.detach().numpy()).max() > 0, name  # the bias is there to be left out
        b = np.sqrt(((x @ w.T) ** 2).sum(0) / 4)
        a = np.sqrt((x * x).sum(0) / 4)
        expected = np.zeros(w.shape, bool)
        if method == "owanda":
            scores = np.abs(w) * b[:, None]
            expected.ravel()[np.argsort(scores.ravel(), kind="stable")[:w.size // 2]] = True
        else:
            scores = np.abs(w) * (a[None, :] + b[:, None])
            np.put_along_axis(expected, np.argsort(scores, 1, kind="stable")[:, :w.shape[1] // 2], True, 1)
        got = pruned[f"model.decoder.layers.0.{name}.weight"] == 0
        assert int((got != expected).sum()) == 0, name


def test_compat_magnitude_names_a_group_row_it_does_not_use(stories, tmp_path):
    """Under --compat, magnitude selects per layer as every reference repository does: an explicit
    --group row used to be dropped without a word."""
    report = tmp_path / "r.json"
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--compat",
                    "wanda", "--group", "row", "--out", tmp_path / "out", "--report", report)
    assert "--group row is not used: under --compat wanda magnitude selects per layer" in proc.stderr
    assert json.loads(report.read_text())["config"]["group"] == "layer"
