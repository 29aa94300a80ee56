"""`symprune prune` on bad input: a clear error naming the problem, a non-zero exit (1 for every
error symprune itself detects), no crash, and nothing written — no --out directory, no report, no
temporary left beside them, the input model untouched."""
import json
import os
import shutil
import time

import pytest

from prune_support import Stories, symprune, tree_digest


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    s = Stories(tmp_path_factory.mktemp("stories"))
    s.digest = tree_digest(s.model)
    (s.root / "empty.txt").write_bytes(b"")
    (s.root / "tiny.txt").write_text("Once upon a time there was a cat.\n")
    (s.root / "calib_dir").mkdir()
    return s


CALIB = ["--nsamples", "4", "--seqlen", "64"]
RANGE = ("[0, 1)", "[0,1)", "outside", "range")

# (id, arguments after --model M, --out O, --report R; required words: each entry is a tuple of
# alternatives, at least one of which must appear (case-insensitive) in stderr; "{model}", "{root}"
# are replaced by the paths).
CASES = [
    ("sparsity-negative", ["--method", "magnitude", "--sparsity", "-0.1"], [("sparsity",), ("-0.1",), RANGE]),
    ("sparsity-one", ["--method", "magnitude", "--sparsity", "1.0"], [("sparsity",), ("1",), RANGE]),
    ("sparsity-above-one", ["--method", "magnitude", "--sparsity", "1.5"], [("sparsity",), ("1.5",), RANGE]),
    ("nm-equal", ["--method", "magnitude", "--nm", "4:4"], [("4:4", "n:m", "--nm"), ("less", "<", "smaller")]),
    ("nm-greater", ["--method", "magnitude", "--nm", "4:2"], [("4:2", "n:m", "--nm"), ("less", "<", "smaller")]),
    ("nm-not-dividing", ["--method", "magnitude", "--nm", "3:7"], [("7",), ("64", "172"), ("divid", "multiple")]),
    ("nm-malformed", ["--method", "magnitude", "--nm", "2-4"], [("2-4",), ("n:m", "--nm")]),
    ("unknown-method", ["--method", "wandaa", "--sparsity", "0.5"], [("wandaa",), ("magnitude",), ("stochria",)]),
    ("wanda-without-calib", ["--method", "wanda", "--sparsity", "0.5"], [("calib",), ("wanda",)]),
    ("ria-without-calib", ["--method", "ria", "--sparsity", "0.5"], [("calib",), ("ria",)]),
    ("calib-missing", ["--method", "wanda", "--sparsity", "0.5", "--calib", "{root}/no_such_file.txt", *CALIB],
     [("{root}/no_such_file.txt",)]),
    ("calib-directory", ["--method", "wanda", "--sparsity", "0.5", "--calib", "{root}/calib_dir", *CALIB],
     [("{root}/calib_dir",)]),
    ("calib-empty", ["--method", "wanda", "--sparsity", "0.5", "--calib", "{root}/empty.txt", *CALIB],
     [("{root}/empty.txt",), ("empty", "window", "token")]),
    ("calib-too-short", ["--method", "wanda", "--sparsity", "0.5", "--calib", "{root}/tiny.txt", *CALIB],
     [("{root}/tiny.txt",), ("window", "token")]),
    ("seqlen-beyond-model", ["--method", "wanda", "--sparsity", "0.5", "--calib", "{root}/first_half.txt",
                             "--nsamples", "4", "--seqlen", "100000"], [("100000",), ("512",)]),
    ("refine-unknown", ["--method", "wanda", "--sparsity", "0.5", "--refine", "dsnoot"],
     [("--refine",), ("dsnoot",), ("r2dsnot",)]),
    ("refine-skip-unknown", ["--method", "wanda", "--sparsity", "0.5", "--refine", "dsnot", "--refine-skip", "ffn"],
     [("--refine-skip",), ("ffn",), ("attn",)]),
    ("refine-without-calib", ["--method", "magnitude", "--sparsity", "0.5", "--refine", "dsnot"],
     [("--refine dsnot",), ("calib",)]),
    ("refine-reg-p", ["--method", "wanda", "--sparsity", "0.5", "--refine", "r2dsnot", "--reg-p", "3"],
     [("--reg-p",), ("3",), ("inf",)]),
    ("refine-gamma-negative", ["--method", "wanda", "--sparsity", "0.5", "--refine", "r2dsnot", "--gamma-grow=-0.1"],
     [("--gamma-grow",), ("-0.1",)]),
    ("refine-gamma-prune-negative",
     ["--method", "wanda", "--sparsity", "0.5", "--refine", "r2dsnot", "--gamma-prune=-1"], [("--gamma-prune",), ("-1",)]),
    ("refine-alpha-negative", ["--method", "wanda", "--sparsity", "0.5", "--refine", "r2dsnot", "--refine-alpha=-1"],
     [("--refine-alpha",), ("-1",)]),
    ("refine-max-cycles-negative", ["--method", "wanda", "--sparsity", "0.5", "--refine", "dsnot", "--max-cycles=-1"],
     [("--max-cycles",), ("-1",)]),
    ("refine-threshold-negative",
     ["--method", "wanda", "--sparsity", "0.5", "--refine", "dsnot", "--refine-threshold=-0.1"],
     [("--refine-threshold",), ("-0.1",)]),
    ("device-unknown", ["--method", "magnitude", "--sparsity", "0.5", "--device", "tpu"],
     [("--device",), ("tpu",), ("cuda",)]),
    ("dtype-unknown", ["--method", "magnitude", "--sparsity", "0.5", "--device", "cpu", "--dtype", "fp8"],
     [("--dtype",), ("fp8",), ("bf16",)]),
    # Lower precision runs on a GPU only: the CPU says so instead of computing in fp32 silently.
    ("dtype-bf16-on-the-cpu", ["--method", "magnitude", "--sparsity", "0.5", "--device", "cpu", "--dtype", "bf16"],
     [("--dtype bf16",), ("fp32 only",), ("--device cuda",)]),
]


def _listing(path):
    return sorted(os.listdir(path))


def _expect_failure(stories, tmp_path, args, words, rc_is_one=True):
    out_dir = tmp_path / "out" / "pruned"
    (tmp_path / "out").mkdir()
    report = tmp_path / "out" / "report.json"
    full = ["prune", "--model", stories.model, *[a.format(root=stories.root, model=stories.model) for a in args]]
    if "--out" not in args:
        full += ["--out", out_dir]
    full += ["--report", report]
    root_before = _listing(stories.root)
    proc = symprune(*full, check=False)
    message = proc.stderr.lower()
    if rc_is_one:
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        assert "symprune: error:" in message, proc.stderr
    else:  # command-line parse errors: CLI11's own message, exit 1 like every bad input
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
    for alternatives in words:
        alternatives = [w.format(root=stories.root, model=stories.model).lower() for w in alternatives]
        assert any(w in message for w in alternatives), (alternatives, proc.stderr)
    assert _listing(tmp_path / "out") == [], "something was written beside --out"
    assert tree_digest(stories.model) == stories.digest, "the input directory was modified"
    assert _listing(stories.root) == root_before
    return proc


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu(stories, tmp_path):
    # Either no CUDA in the build or no device: both say why, before anything is read or written.
    _expect_failure(stories, tmp_path, ["--method", "magnitude", "--sparsity", "0.5", "--device", "cuda"],
                    [("--device cuda",), ("built without cuda", "no usable cuda device")])


@pytest.mark.parametrize("args,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(stories, tmp_path, args, words):
    _expect_failure(stories, tmp_path, args, words)


# Exactly one of --sparsity / --nm: may be enforced by the command-line parser (its own exit code).
@pytest.mark.parametrize("args", [["--sparsity", "0.5", "--nm", "2:4"], []], ids=["both", "neither"])
def test_sparsity_xor_nm(stories, tmp_path, args):
    proc = _expect_failure(stories, tmp_path, ["--method", "magnitude", *args], [("sparsity",), ("nm",)],
                           rc_is_one=False)
    assert proc.returncode == 1 or "symprune: error:" not in proc.stderr.lower()


def test_unknown_option(stories, tmp_path):
    _expect_failure(stories, tmp_path, ["--method", "magnitude", "--sparsity", "0.5", "--bogus-option", "3"],
                    [("--bogus-option",)], rc_is_one=False)


# A misspelled word is named with its nearest known one, before CLI11 parses: CLI11 said "A subcommand is
# required" for a misspelled command, and "--model is required" for `prune --modle M`.
@pytest.mark.parametrize("args,message", [
    (["prnue", "--model", "m"], "symprune: unknown command 'prnue' (did you mean 'prune'?); the commands are: calib, "
                                "convert-llama2c, eval, info, inspect, logits, prune, tokenize"),
    (["--log-level", "debug", "evl"], "unknown command 'evl' (did you mean 'eval'?)"),
    (["prune", "--modle", "m", "--sparsity", "0.5"], "symprune prune: unknown option --modle (did you mean --model?)"),
    (["prune", "--model=m", "--nsample=4"], "symprune prune: unknown option --nsample (did you mean --nsamples?)"),
    (["eval", "--model", "m", "--log-level", "info", "--batchh", "2"], "symprune eval: unknown option --batchh "
                                                                       "(did you mean --batch?)"),
    (["prune", "--model", "m", "--frobnicate", "3"], "symprune prune: unknown option --frobnicate ('symprune prune "
                                                     "--help' lists the options)"),
    (["--log-level", "info"], "symprune: a command is required: calib, convert-llama2c, eval, info, inspect, "
                              "logits, prune, tokenize ('symprune --help' describes them)"),
], ids=["command", "command-after-top-level-option", "option", "option-with-equals", "option-after-top-level-option",
        "option-far-from-any", "no-command"])
def test_misspelled_words_are_named_with_the_nearest_known_one(args, message):
    proc = symprune(*args, check=False)
    assert proc.returncode == 1
    assert message in proc.stderr.splitlines()[0], proc.stderr
    assert "Run with --help for more information." in proc.stderr


def test_values_and_help_are_not_taken_for_misspelled_words(stories, tmp_path):
    # Values that look like words (a negative number, a command's name) are the options' values; --help
    # still answers with a misspelled option beside it.
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--alpha",
                    "-1", "--out", tmp_path / "prune", check=False)
    assert "unknown" not in proc.stderr and "--alpha" in proc.stderr, proc.stderr
    assert symprune("prune", "--bogus", "--help").stdout.startswith("Prune a model")
    # A required value is taken whatever it looks like, as CLI11 takes it.
    tokens = symprune("tokenize", "--tokenizer", stories.model, "--text", "-Hello").stdout
    assert tokens.strip(), tokens


@pytest.mark.parametrize("args,message", [
    (["prune", "-model", "m"], "symprune prune: unknown option -model (did you mean --model?)"),
    (["prune", "--model", "m", "--", "extra"], "symprune prune: unexpected argument 'extra'"),
    # CLI11 said "--method: At Most 1 required but received 2"; a flag or a recipe's value is no repeat.
    (["prune", "--model", "m", "--method", "magnitude", "--method=wanda"],
     "symprune prune: --method is given twice ('magnitude', then 'wanda'): give it once"),
    (["--log-level", "warn", "eval", "--log-level", "info"],
     "symprune eval: --log-level is given twice ('warn', then 'info'): give it once"),
    (["prune", "--force", "--force", "--seed", "1", "--seed", "2"],
     "symprune prune: --seed is given twice ('1', then '2'): give it once"),
    # CLI11 reads "--report=" as "--report" and took the next word as the report's path.
    (["prune", "--model", "m", "--report=", "--force"],
     "--report: an empty value (an unset variable in a script?): give one, or leave the option out"),
    (["tokenize", "--tokenizer", "t", "--text=", "--count"],
     '--text: an empty value (an unset variable in a script?): give one, or write --text "" for an empty one'),
], ids=["single-dash-long-name", "after-double-dash", "repeated-option", "repeated-top-level-option",
        "repeated-after-a-repeated-flag", "empty-after-equals", "empty-after-equals-of-a-text"])
def test_single_dash_names_and_words_after_double_dash(args, message):
    proc = symprune(*args, check=False)
    assert proc.returncode == 1 and message in proc.stderr.splitlines()[0], proc.stderr


def test_out_equal_to_input(stories, tmp_path):
    _expect_failure(stories, tmp_path, ["--method", "magnitude", "--sparsity", "0.5", "--out", "{model}"],
                    [("{model}",), ("--out", "output")])


def test_out_inside_input(stories, tmp_path):
    _expect_failure(stories, tmp_path, ["--method", "magnitude", "--sparsity", "0.5", "--out", "{model}/pruned"],
                    [("{model}",), ("--out", "output"), ("inside", "within", "under")])
    assert not (stories.model / "pruned").exists()


def test_out_inside_input_via_dot_dot(stories, tmp_path):
    # The same directory spelled differently must still be recognised.
    _expect_failure(stories, tmp_path, ["--method", "magnitude", "--sparsity", "0.5",
                                        "--out", "{model}/../" + stories.model.name],
                    [("--out", "output")])


def test_existing_out_without_force(stories, tmp_path):
    out_dir = tmp_path / "existing"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("user data")
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5",
                    "--out", out_dir, check=False)
    assert proc.returncode == 1, proc.stderr
    assert str(out_dir) in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert _listing(out_dir) == ["keep.txt"] and (out_dir / "keep.txt").read_text() == "user data"
    assert _listing(tmp_path) == ["existing"]


def _overflowing_model(stories, tmp_path):
    """A copy of stories260K whose block-0 v_proj is finite but huge (3e38): the fp32 forward overflows and
    the attention output (the input of o_proj) becomes Inf/NaN."""
    import shutil

    from safetensors.numpy import load_file, save_file

    model = tmp_path / "overflow-model"
    shutil.copytree(stories.model, model)
    (weights_file,) = model.glob("*.safetensors")
    tensors = load_file(str(weights_file))
    tensors["model.layers.0.self_attn.v_proj.weight"][:] = 3e38
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    return model


def test_non_finite_perplexity_is_an_error(stories, tmp_path):
    proc = symprune("eval", "--model", _overflowing_model(stories, tmp_path), "--text", stories.second,
                    "--seqlen", "64", "--max-chunks", "2", "--report", tmp_path / "eval.json", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "perplexity: chunk 0 (tokens 0..63) has a non-finite loss" in proc.stderr, proc.stderr
    assert not (tmp_path / "eval.json").exists()


def test_non_finite_activations_are_named(stories, tmp_path):
    # The pruning run must stop naming the first linear with non-finite inputs, not write NaN-scored masks.
    model = _overflowing_model(stories, tmp_path)
    proc = symprune("prune", "--model", model, "--method", "wanda", "--sparsity", "0.5", "--calib",
                    stories.first, *CALIB, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "non-finite activations (NaN or Inf)" in proc.stderr, proc.stderr
    assert "0.self_attn.o_proj" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tensor,index", [("model.layers.1.input_layernorm.weight", 3),
                                           ("model.layers.4.post_attention_layernorm.weight", 0)])
def test_non_finite_block_norms_are_named_by_a_method_without_a_forward_pass(stories, tmp_path, tensor, index):
    """magnitude runs no forward pass: a NaN in a block's norm used to be copied into the pruned model, exit 0."""
    import shutil
    import numpy as np
    from safetensors.numpy import load_file, save_file
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    tensors = load_file(str(model / "model.safetensors"))
    norm = tensors[tensor].copy()
    norm[index] = np.nan
    tensors[tensor] = norm
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    proc = symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                    tmp_path / "out", check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"error: {tensor}: entry [{index}] is nan: the model's weights hold NaN or Inf" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_report_directory_is_checked_before_pruning(stories, tmp_path):
    # Checked up front (io::check_output_file_directory, the atomic writer's own check), so the run stops
    # before any pruning and leaves no model behind.
    out = tmp_path / "pruned"
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--out", out,
                    "--report", tmp_path / "no_such_dir" / "report.json", check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"{tmp_path / 'no_such_dir' / 'report.json'}: directory {tmp_path / 'no_such_dir'} does not exist" \
        in proc.stderr, proc.stderr
    assert "block 1/" not in proc.stderr  # no block was pruned
    assert not out.exists()
    assert tree_digest(stories.model) == stories.digest


def test_a_config_claiming_far_more_layers_than_stored_fails_at_once(stories, tmp_path):
    # Used to build a list of every claimed layer's tensors first: gigabytes, then the OOM killer.
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = 4611686018427387904
    (model / "config.json").write_text(json.dumps(config))
    start = time.time()
    proc = symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                    tmp_path / "out", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "missing tensor 'model.layers.4611686018427387903." in proc.stderr, proc.stderr
    assert time.time() - start < 30 and not (tmp_path / "out").exists()


def test_options_the_run_does_not_read_are_named(stories, tmp_path):
    # A mistyped --method or a forgotten --refine must not pass silently for the run that was meant.
    proc = symprune("prune", "--model", stories.model, "--method", "magnitude", "--sparsity", "0.5", "--out",
                    tmp_path / "out", "--p", "2", "--beta", "0.5", "--max-cycles", "3", "--no-grow-relative",
                    "--eval-seqlen", "32", "--checkpoint-every", "2")
    for option, reader in [("--p", "--method lp"), ("--beta", "--method stochria"),
                           ("--max-cycles", "a refinement (--refine)"), ("--no-grow-relative", "--refine r2dsnot"),
                           ("--eval-seqlen", "--eval"), ("--checkpoint-every", "--checkpoint")]:
        assert f"{option} is not used: only {reader} reads it" in proc.stderr, proc.stderr
    # The options a run reads are not named.
    quiet = symprune("prune", "--model", stories.model, "--method", "lp", "--p", "2", "--alpha", "0", "--sparsity",
                     "0.5", "--out", tmp_path / "lp")
    assert "is not used" not in quiet.stderr, quiet.stderr


def test_calib_synthetic_is_a_value_not_a_file(stories, tmp_path, monkeypatch):
    # `--calib synthetic` means random token ids; `symprune calib --calib synthetic` reads a file of that
    # name. prune says which it did, on a real model and where such a file exists.
    monkeypatch.chdir(tmp_path)
    args = ["prune", "--model", stories.model, "--method", "wanda", "--sparsity", "0.5", "--calib", "synthetic",
            "--nsamples", "2", "--seqlen", "32"]
    proc = symprune(*args, "--out", tmp_path / "a")
    assert "--calib synthetic: calibrating" in proc.stderr and "on uniformly random token ids" in proc.stderr
    (tmp_path / "synthetic").write_text("Once upon a time there was a file named synthetic.\n" * 50)
    proc = symprune(*args, "--out", tmp_path / "b")
    assert "the file ./synthetic is not read (name it ./synthetic to calibrate on it)" in proc.stderr
