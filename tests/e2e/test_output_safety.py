"""Nothing lost, nothing misread (issue 13): what symprune may write, interrupted and concurrent runs, and
the command-line checks that used to let bad numbers through.

Runs stories260K with small calibration sets; the signal tests wait for a progress line on stderr and then
signal the process, so they do not depend on timing beyond "the run is at that stage"."""
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from prune_support import (BIN, DATA, PROVENANCE, Run, Stories, head_overflowing_model, output_digest, read_json,
                           symprune, tree_digest)

SMALL = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "8", "--seqlen", "64"]


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    s = Stories(tmp_path_factory.mktemp("stories"))
    s.digest = tree_digest(s.model)
    return s


def prune_args(stories, out, *extra):
    """A small wanda run; options in `extra` replace the defaults of SMALL with the same name."""
    extra = list(map(str, extra))
    base = list(SMALL)
    for i in range(0, len(SMALL), 2):
        if SMALL[i] in extra:
            base[i:i + 2] = [None, None]
    base = [a for a in base if a is not None]
    return ["prune", "--model", stories.model, *base, "--calib", stories.first, "--out", out, *extra]


def listing(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


# --- where outputs may go ---------------------------------------------------------------------------

def test_report_may_not_overwrite_the_input_or_the_output(stories, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    before = tree_digest(model)
    for report, expected in [(model / "config.json", "is inside the input model directory"),
                             (model / "x.json", "is inside the input model directory"),
                             (tmp_path / "out" / "config.json", "is inside the output directory")]:
        proc = symprune("prune", "--model", model, *SMALL, "--calib", stories.first, "--out", tmp_path / "out",
                        "--report", report, check=False)
        assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
        assert tree_digest(model) == before
        assert not (tmp_path / "out").exists()
    # --force over an earlier output does not let the report land inside it either.
    symprune(*prune_args(stories, tmp_path / "out"))
    proc = symprune(*prune_args(stories, tmp_path / "out", "--force", "--report", tmp_path / "out" / "config.json"),
                    check=False)
    assert proc.returncode == 1 and "is inside the output directory" in proc.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"


def test_a_checkpoint_on_an_input_is_named_as_one_not_as_an_earlier_runs(stories, tmp_path):
    # Before the input check, "--checkpoint calib.txt" said calib.txt was an earlier run's checkpoint and told
    # the user to remove it.
    calib = tmp_path / "calib.txt"
    shutil.copy(stories.first, calib)
    for checkpoint in (calib, stories.model / "model.safetensors"):
        proc = symprune("prune", "--model", stories.model, *SMALL, "--calib", calib, "--out", tmp_path / "out",
                        "--checkpoint", checkpoint, check=False)
        assert proc.returncode == 1, proc.stderr
        assert "from an earlier run" not in proc.stderr and "remove" not in proc.stderr, proc.stderr
        assert f"--checkpoint {checkpoint} is " in proc.stderr, proc.stderr
    assert calib.read_bytes() == stories.first.read_bytes() and tree_digest(stories.model) == stories.digest
    assert listing(tmp_path) == ["calib.txt"]


def test_a_perplexity_beyond_a_double_is_null_beside_its_finite_mean_nll(stories, tmp_path):
    """exp(NLL) overflows past NLL 709.8: the report's perplexity is null (JSON has no inf), which alone read like
    an interrupted evaluation; the mean NLL beside it says which."""
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1200  # finite logits, huge losses
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    report = tmp_path / "r.json"
    symprune("prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5", "--eval", stories.second,
             "--eval-seqlen", "64", "--eval-max-chunks", "2", "--out", tmp_path / "out", "--report", report)
    r = read_json(report)
    assert "incomplete" not in r, r
    p = r["perplexity"]
    assert p["dense"] is None and p["dense_mean_nll"] > 709.8 and p["pruned_mean_nll"] > 0, p
    assert (p["pruned"] is None) == (p["pruned_mean_nll"] > 709.8), p


def test_a_failed_evaluation_leaves_no_new_model_and_keeps_only_one_that_replaced_an_earlier(stories, tmp_path):
    model = head_overflowing_model(stories.model, tmp_path / "model")
    out = tmp_path / "out"
    out.mkdir()  # made by a job script beforehand: emptied again, not left holding the failed run's model
    args = ["prune", "--model", model, *SMALL, "--calib", stories.first, "--eval", stories.second,
            "--eval-seqlen", "64", "--eval-max-chunks", "1", "--out", out]
    proc = symprune(*args, check=False)
    assert proc.returncode == 1 and "has a non-finite loss" in proc.stderr, proc.stderr
    assert f"the run failed, so its pruned model {out} was removed" in proc.stderr, proc.stderr
    assert out.is_dir() and listing(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]
    # Over an earlier output (--force) the earlier one is gone: the new model stays, and the message says so.
    symprune(*prune_args(stories, out))
    proc = symprune(*args, "--force", check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"the pruned model {out} was kept (it replaced an earlier output)" in proc.stderr, proc.stderr
    assert (out / "model.safetensors").exists()


def test_a_report_that_cannot_be_written_removes_the_model_and_says_so(stories, tmp_path):
    # The model was written ("wrote OUT" in the log) before the report failed: the error must say it is gone.
    out = tmp_path / "out"
    proc = symprune(*prune_args(stories, out, "--report", tmp_path / "r.json"), check=False,
                    env={"SYMPRUNE_FAULT": "report:error"})
    assert proc.returncode == 1, proc.stderr
    removed = f"injected fault at report (SYMPRUNE_FAULT); the run failed, so its pruned model {out} was removed"
    assert removed in proc.stderr, proc.stderr
    assert listing(tmp_path) == []


def test_error_messages_escape_bytes_that_are_not_utf8(stories, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_bytes(b'method = "wanda\\\xda\x1b[2J"\n')
    proc = subprocess.run([BIN, *map(str, prune_args(stories, tmp_path / "out", "--recipe", recipe))],
                          capture_output=True)
    assert proc.returncode == 1
    assert b"\xda" not in proc.stderr and b"\x1b" not in proc.stderr, proc.stderr
    assert b"\\xDA" in proc.stderr, proc.stderr
    assert listing(tmp_path) == ["recipe.toml"]


def test_force_never_wipes_a_working_directory(stories, tmp_path):
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "main.cc").write_text("int main() {}")
    (work / "notes.txt").write_text("notes")
    before = tree_digest(work)
    proc = subprocess.run([BIN, *map(str, prune_args(stories, ".", "--force"))], cwd=work, capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert "was not written by symprune" in proc.stderr
    assert tree_digest(work) == before


def test_force_cannot_delete_the_weights_behind_a_hugging_face_cache_snapshot(stories, tmp_path):
    """models--org--name/snapshots/REV/* are links into ../../blobs: --out blobs --force deleted the model."""
    repo = tmp_path / "hub" / "models--org--stories"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(stories.model.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snapshot / f.name).symlink_to(Path("../../blobs") / f"blob{i}")
    (blobs / PROVENANCE).write_text('{"tool": "symprune"}')  # even looking like a symprune output
    before = tree_digest(blobs)
    for out, expected in [(blobs, "is the same as the directory holding the input model's files"),
                          (blobs / "pruned", "is inside the directory holding the input model's files"),
                          (repo, "contains the input model directory")]:
        proc = symprune("prune", "--model", snapshot, *SMALL, "--calib", stories.first, "--out", out, "--force",
                        check=False)
        assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
        assert tree_digest(blobs) == before
    proc = symprune("prune", "--model", snapshot, *SMALL, "--calib", stories.first, "--out", tmp_path / "o",
                    "--report", snapshot / "config.json", check=False)
    assert proc.returncode == 1 and "is inside the directory holding the input model's files" in proc.stderr
    assert tree_digest(blobs) == before


def test_dangling_link_and_long_names_fail_before_any_work(stories, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone" / "out")
    proc = symprune(*prune_args(stories, tmp_path / "link"), check=False)
    assert proc.returncode == 1 and "which does not exist" in proc.stderr
    assert "block 1/" not in proc.stderr  # refused up front
    proc = symprune(*prune_args(stories, tmp_path / "out", "--report", tmp_path / ("r" * 250)), check=False)
    assert proc.returncode == 1 and "choose a name of at most 243 bytes" in proc.stderr
    assert "block 1/" not in proc.stderr and listing(tmp_path) == ["link"]


def test_eval_report_in_a_missing_directory_fails_before_the_evaluation(stories, tmp_path):
    proc = symprune("eval", "--model", stories.model, "--text", stories.second, "--seqlen", "64",
                    "--report", tmp_path / "missing" / "r.json", check=False)
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    assert "chunks" not in proc.stderr  # no evaluation ran


def test_outputs_follow_the_umask(stories, tmp_path):
    """Outputs are created with mkstemp/mkdtemp (0600/0700) and then widened: they used to become 0644/0755
    whatever the umask, so weights kept private (umask 077) were readable by everyone."""
    out, report = tmp_path / "out", tmp_path / "r.json"
    proc = subprocess.run([BIN, *map(str, prune_args(stories, out, "--report", report))], capture_output=True,
                          text=True, preexec_fn=lambda: os.umask(0o077))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for path in [report, *out.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    converted = tmp_path / "converted"
    proc = subprocess.run([BIN, "convert-llama2c", "--checkpoint", DATA / "stories260K" / "stories260K.bin",
                           "--tokenizer", DATA / "stories260K" / "tok512.bin", "--out", converted],
                          capture_output=True, text=True, preexec_fn=lambda: os.umask(0o077))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(converted.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in converted.iterdir())
    proc = subprocess.run([BIN, *map(str, prune_args(stories, tmp_path / "default"))], capture_output=True,
                          text=True, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "default").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "default" / "model.safetensors").stat().st_mode) == 0o644


def test_a_prepared_output_directory_keeps_its_mode_and_group(stories, tmp_path):
    """An empty --out made for the run (a group's setgid directory, say) is replaced by the new directory:
    that one now takes its mode and group, and its files the group, as if written into it."""
    import grp
    # A group this user may give a file: any as root, else one of its own.
    gids = [g.gr_gid for g in grp.getgrall()] if os.geteuid() == 0 else os.getgroups()
    gid = next((g for g in gids if g != os.getgid()), None)
    if gid is None:
        pytest.skip("no second group to give the directory")
    out = tmp_path / "shared"
    out.mkdir()
    os.chown(out, -1, gid)
    os.chmod(out, 0o2750)
    symprune(*prune_args(stories, out))
    assert stat.S_IMODE(out.stat().st_mode) == 0o2750 and out.stat().st_gid == gid
    assert all(p.stat().st_gid == gid for p in out.iterdir())
    # A read-only mode is given last (the files are written first), and the replaced directory of that mode
    # is removed all the same.
    os.chmod(out, 0o555)
    symprune(*prune_args(stories, out, "--force", "--sparsity", "0.6"))
    assert stat.S_IMODE(out.stat().st_mode) == 0o555
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]
    os.chmod(out, 0o755)


# --- concurrent and interrupted runs ----------------------------------------------------------------

def test_a_second_run_to_the_same_output_is_refused_while_the_first_writes(stories, tmp_path):
    out = tmp_path / "out"
    first = Run(prune_args(stories, out), env={"SYMPRUNE_FAULT": "before_install:sleep=60"})
    first.wait_for("block 2/")
    time.sleep(0.5)
    proc = symprune(*prune_args(stories, out, "--force"), check=False)
    assert proc.returncode == 1
    assert f"--out {out} is being written by another symprune run (pid {first.proc.pid})" in proc.stderr
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 130
    assert listing(tmp_path) == []


def test_sigint_during_the_run_leaves_nothing_and_exits_130(stories, tmp_path):
    out = tmp_path / "out"
    # With --eval every block also moves the evaluation chunks: the run is busy in the block loop.
    run = Run(prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--report",
                         tmp_path / "r.json"))
    run.wait_for("block 1/5 done")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 130
    assert "SIGINT received: stopping at the next safe point" in run.stderr
    assert "symprune: interrupted by SIGINT: stopped before finishing; unfinished outputs were removed" in run.stderr
    assert listing(tmp_path) == []  # no output, no report, no staging directory, no lock


def test_sighup_ignored_at_start_stays_ignored_as_under_nohup(stories, tmp_path):
    out = tmp_path / "out"
    run = Run(prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64"),
              preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    run.wait_for("block 1/5 done")
    run.proc.send_signal(signal.SIGHUP)  # the terminal of a nohup run closing
    assert run.finish() == 0, run.stderr
    assert "SIGHUP" not in run.stderr and (out / "model.safetensors").exists()


def test_report_into_a_fifo_or_device_is_refused_before_any_work(stories, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (prune_args(stories, tmp_path / "out", "--report", fifo),
                 ["calib", "--tokenizer", stories.model, "--calib", stories.first, "--nsamples", "2", "--seqlen",
                  "8", "--out", fifo]):
        proc = symprune(*args, check=False)
        assert proc.returncode == 1 and f"{fifo} exists and is not a regular file" in proc.stderr, proc.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and listing(tmp_path) == ["fifo"]


def test_sigterm_while_writing_removes_the_staging_directory(stories, tmp_path):
    out = tmp_path / "out"
    run = Run(prune_args(stories, out), env={"SYMPRUNE_FAULT": "before_install:sleep=60"})
    run.wait_for("block 5/")
    time.sleep(0.5)
    assert any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir())
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 143
    assert listing(tmp_path) == []


def test_a_second_signal_stops_at_once_and_cleans_up(stories, tmp_path):
    out = tmp_path / "out"
    # Busy before install, between safe points: the first SIGINT cannot stop it, the second must, at once.
    run = Run(prune_args(stories, out), env={"SYMPRUNE_FAULT": "before_install:busy=120"})
    run.wait_for("block 5/")
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("SIGINT received")
    start = time.time()
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(timeout=20) == 130
    assert time.time() - start < 10
    assert "second SIGINT: stopped at once; removed the unfinished" in run.stderr
    assert listing(tmp_path) == []


@pytest.mark.parametrize("change", ["weights", "config"])
def test_a_model_changed_during_the_run_is_not_written_mixed(stories, tmp_path, change):
    # A copy over the input during the run used to give new weights under old masks (and the new config).
    model = shutil.copytree(stories.model, tmp_path / "model")
    out = tmp_path / "out"
    args = prune_args(stories, out)
    args[args.index("--model") + 1] = str(model)
    run = Run(args, env={"SYMPRUNE_FAULT": "before_install:sleep=3"})
    run.wait_for("block 5/5 done")
    if change == "weights":
        data = bytearray((model / "model.safetensors").read_bytes())
        data[-4:] = bytes(4)  # same size, one weight changed, in place (as cp does)
        with open(model / "model.safetensors", "r+b") as f:
            f.write(data)
    else:
        config = model / "config.json"
        config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 0.5'))
    assert run.finish() == 1
    name = "model.safetensors" if change == "weights" else "config.json"
    assert f"{model / name} was modified while this run was reading the model" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("force,before,replacement", [
    (True, "earlier-output", "directory"), (True, "earlier-output", "file"), (False, "empty", "directory")])
def test_data_put_in_place_of_the_output_during_the_run_is_kept(stories, tmp_path, force, before, replacement):
    """What --out is checked to be when the run starts (an earlier symprune output with --force, an empty
    directory) may be replaced by someone's own data while the run works: that is refused before installing,
    and kept (it used to be replaced, and removed, with exit 0)."""
    out = tmp_path / "out"
    if before == "earlier-output":
        symprune("prune", *prune_args(stories, out)[1:])
    else:
        out.mkdir()
    run = Run(prune_args(stories, out, *(["--force"] if force else [])),
              env={"SYMPRUNE_FAULT": "before_install:sleep=3"})
    run.wait_for("block 5/5 done")
    shutil.rmtree(out)
    if replacement == "directory":
        out.mkdir()
        (out / "precious.txt").write_text("someone's data")
    else:
        out.write_text("someone's data")
    assert run.finish() == 1, run.stderr
    assert "(it changed while this run was working)" in run.stderr, run.stderr
    data = out / "precious.txt" if replacement == "directory" else out
    assert data.read_text() == "someone's data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "staging directories left behind"


def test_the_temporary_file_of_a_report_killed_while_written_is_removed_by_the_next_run(stories, tmp_path):
    """A kill while the report (or calib's and logits' --out) is written leaves its .NAME.tmp.XXXXXX: the next
    run for that file removes it, under the file's lock (it stayed for good)."""
    stale = tmp_path / ".r.json.tmp.k1LL3d"
    stale.write_text("{ half a report")
    other = tmp_path / ".r.json.tmp.notmine"  # not a mkstemp name of this file: left alone
    other.write_text("x")
    proc = symprune(*prune_args(stories, tmp_path / "out"), "--report", tmp_path / "r.json")
    assert f"--report: removed {stale} left by an interrupted run" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.json.tmp.notmine", "out", "r.json"]
    # While a run writes it, another run for the same report is refused.
    run = Run(prune_args(stories, tmp_path / "out-a", "--report", tmp_path / "r.json"),
              env={"SYMPRUNE_FAULT": "report:sleep=5"})
    run.wait_for("block 5/5 done")
    second = symprune(*prune_args(stories, tmp_path / "out-b"), "--report", tmp_path / "r.json", check=False)
    assert second.returncode == 1 and "is being written by another symprune run (pid" in second.stderr, second.stderr
    assert run.finish() == 0, run.stderr
    # A report replaced by a directory while the run works is called a directory when it is written.
    run = Run(prune_args(stories, tmp_path / "out-c", "--report", tmp_path / "late.json"),
              env={"SYMPRUNE_FAULT": "report:sleep=3"})
    run.wait_for("block 5/5 done")
    (tmp_path / "late.json").mkdir()
    assert run.finish() == 1
    assert "late.json exists and is not a regular file (a directory)" in run.stderr, run.stderr
    shutil.rmtree(tmp_path / "out-a")
    # A symbolic link stands for its target, as --out's and --checkpoint's do: the target is replaced (the link
    # was, leaving the target stale), and the lock and temporaries are beside it.
    target_dir = tmp_path / "elsewhere"
    target_dir.mkdir()
    (target_dir / "r.json").write_text("the link's target")
    (tmp_path / "linked.json").symlink_to(target_dir / "r.json")
    beside_target = target_dir / ".r.json.tmp.Zz9yX8"
    beside_target.write_text("{")
    symprune(*prune_args(stories, tmp_path / "out2"), "--report", tmp_path / "linked.json")
    assert not beside_target.exists() and [p.name for p in target_dir.iterdir()] == ["r.json"]
    assert (tmp_path / "linked.json").is_symlink() and read_json(target_dir / "r.json")["config"]["nsamples"] == 8
    # A link to a device is refused, naming the link (the write would put a file in the device's place).
    (tmp_path / "null.json").symlink_to("/dev/null")
    proc = symprune(*prune_args(stories, tmp_path / "out3"), "--report", tmp_path / "null.json", check=False)
    assert proc.returncode == 1 and f"--report {tmp_path / 'null.json'} is a symbolic link to /dev/null, which is " \
        "not a regular file" in proc.stderr, proc.stderr
    assert not (tmp_path / "out3").exists()
    # Also through /proc links whose target has no path (stdout is a pipe here: "pipe:[N]").
    (tmp_path / "stdout.json").symlink_to("/dev/stdout")
    proc = symprune(*prune_args(stories, tmp_path / "out3"), "--report", tmp_path / "stdout.json", check=False)
    assert proc.returncode == 1 and "stdout.json is a symbolic link to /dev/stdout, which is not a regular file " \
        "(a device, FIFO or socket)" in proc.stderr, proc.stderr
    assert not (tmp_path / "out3").exists() and (tmp_path / "stdout.json").is_symlink()
    stale_tokens = tmp_path / ".ids.bin.tmp.AbC123"
    stale_tokens.write_bytes(b"\0" * 8)
    symprune("calib", "--calib", stories.first, "--tokenizer", stories.model, "--nsamples", "2", "--seqlen", "16",
             "--out", tmp_path / "ids.bin")
    assert not stale_tokens.exists() and (tmp_path / "ids.bin").stat().st_size == 2 * 16 * 4


def test_sigkill_leaves_a_staging_directory_that_the_next_run_removes(stories, tmp_path):
    out = tmp_path / "out"
    run = Run(prune_args(stories, out), env={"SYMPRUNE_FAULT": "before_install:sleep=60"})
    run.wait_for("block 5/")
    time.sleep(0.5)
    run.proc.kill()
    run.finish()
    left = [p.name for p in tmp_path.iterdir()]
    assert any(n.startswith(".out.tmp-") for n in left), left
    proc = symprune(*prune_args(stories, out))
    assert "left by an interrupted run" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "model.safetensors").exists()


def test_interrupted_pruned_evaluation_keeps_the_model_and_marks_the_report(stories, tmp_path):
    out, report = tmp_path / "out", tmp_path / "r.json"
    # The pruned evaluation's last stage waits (as if long): the model is written by then.
    run = Run(prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--report", report),
              env={"SYMPRUNE_FAULT": "pruned_eval:sleep=60"})
    run.wait_for("scoring the pruned model's evaluation chunks")
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 130
    assert f"the pruned model {out} is complete, but its evaluation was not finished" in run.stderr
    assert (out / "model.safetensors").exists() and (out / PROVENANCE).exists()
    r = read_json(report)
    assert r["incomplete"] == "pruned evaluation interrupted by SIGINT"
    assert r["perplexity"]["dense"] > 1 and r["perplexity"]["pruned"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r.json"]


@pytest.mark.parametrize("stage", ["dense", "pruned"])
def test_a_signal_while_the_last_evaluation_batch_is_scored_keeps_its_perplexity(stories, tmp_path, stage):
    """The stopping point after the dense evaluation used to come before its perplexity was kept, and one after
    the pruned evaluation before the pruned one was: a finished figure was reported as interrupted."""
    out, report = tmp_path / "out", tmp_path / "r.json"
    run = Run(prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--eval-max-chunks", "4",
                         "--report", report), env={"SYMPRUNE_FAULT": f"eval_scored:{stage}:busy=3"})
    run.wait_for(f"{stage} perplexity: chunks 4/4")  # logged as the last batch is done, before the busy wait
    run.proc.send_signal(signal.SIGTERM)
    r_code = run.finish()
    r = read_json(report)
    assert r["perplexity"]["dense"] > 1, r
    if stage == "dense":
        assert r_code == 143, run.stderr
        assert r["incomplete"] == "pruned evaluation interrupted by SIGTERM" and r["perplexity"]["pruned"] is None
    else:
        assert r_code == 0, run.stderr
        assert "incomplete" not in r and r["perplexity"]["pruned"] > 1, r
        assert "SIGTERM arrived after the run's last safe point" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r.json"]


def test_a_signal_while_the_report_is_written_is_said_to_have_stopped_nothing(stories, tmp_path):
    """Past the last safe point the run finishes (exit 0, every output complete); its notice had said it
    would stop, so the end says it did not."""
    out, report = tmp_path / "out", tmp_path / "r.json"
    run = Run(prune_args(stories, out, "--report", report), env={"SYMPRUNE_FAULT": "report:sleep=60"})
    run.wait_for(f"wrote {out}")
    time.sleep(0.3)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.stderr
    assert "SIGTERM arrived after the run's last safe point: the run finished, and its outputs are complete" \
        in run.stderr
    assert read_json(report)["sparsity"]["total"] > 0 and (out / "model.safetensors").exists()


@pytest.mark.parametrize("fault,stage,resumed_stage", [
    ("before_install:sleep=60", "block 5/5 done", "resuming from checkpoint"),
    # One signalled while the last dense batch is scored stops after the dense evaluation.
    ("eval_scored:dense:sleep=60", "dense perplexity: chunks 4/4", "dense perplexity: chunks 4/4")])
def test_a_signal_after_the_last_block_with_a_checkpoint_exits_75_and_resumes(stories, tmp_path, fault, stage,
                                                                              resumed_stage):
    """The checkpoint holds every block by then: the stop is a saved one (75, what the Slurm scripts requeue
    on), and --resume auto writes and evaluates again."""
    out, report, checkpoint = tmp_path / "out", tmp_path / "r.json", tmp_path / "run.h5"
    args = prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--eval-max-chunks", "4",
                      "--report", report, "--checkpoint", checkpoint, "--resume", "auto")
    run = Run(args, env={"SYMPRUNE_FAULT": fault})
    run.wait_for(stage)
    run.proc.send_signal(signal.SIGUSR1)
    assert run.finish() == 75, run.stderr
    assert f"blocks 1..5 of 5 are saved in checkpoint {checkpoint}; continue with --resume auto" in run.stderr
    assert checkpoint.exists() and not (tmp_path / "run.h5.done").exists()
    if fault.startswith("eval_scored"):  # the dense evaluation had finished: its perplexity is reported
        assert read_json(report)["incomplete"] == "pruned evaluation interrupted by SIGUSR1"
    # Stopped again after resuming at the end: nothing new was saved, and yet the stop is a saved one.
    again = Run(args, env={"SYMPRUNE_FAULT": fault})
    again.wait_for(resumed_stage)
    again.proc.send_signal(signal.SIGUSR1)
    assert again.finish() == 75, again.stderr
    assert "resuming from checkpoint" in again.stderr
    assert f"blocks 1..5 of 5 are saved in checkpoint {checkpoint}; continue with --resume auto" in again.stderr
    resumed = symprune(*args)
    assert "resuming from checkpoint" in resumed.stderr
    r = read_json(report)
    assert "incomplete" not in r and r["perplexity"]["pruned"] > 1
    assert (tmp_path / "run.h5.done").exists() and (out / "model.safetensors").exists()


def test_a_signal_in_the_pruned_evaluation_with_a_checkpoint_exits_75_and_resumes(stories, tmp_path):
    """Under a checkpoint the evaluations stop at the next batch as in a run without one; every block is saved
    by then, so the stop is a saved one (75) and --resume auto writes and evaluates again. (They used to run to
    their end, and a warning early in a long evaluation took effect only after it.)"""
    out, report, checkpoint = tmp_path / "out", tmp_path / "r.json", tmp_path / "run.h5"
    args = prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--eval-max-chunks", "4",
                      "--report", report, "--checkpoint", checkpoint, "--resume", "auto")
    run = Run(args, env={"SYMPRUNE_FAULT": "pruned_eval:busy=3"})
    run.wait_for("scoring the pruned model's evaluation chunks")
    run.proc.send_signal(signal.SIGUSR1)
    assert run.finish() == 75, run.stderr
    assert f"the pruned model {out} is complete, but its evaluation was not finished" in run.stderr
    assert f"blocks 1..5 of 5 are saved in checkpoint {checkpoint}; continue with --resume auto" in run.stderr
    r = read_json(report)
    assert r["incomplete"] == "pruned evaluation interrupted by SIGUSR1", r
    assert r["perplexity"]["dense"] > 1 and r["perplexity"]["pruned"] is None
    assert not (tmp_path / "run.h5.done").exists() and (out / "model.safetensors").exists()
    resumed = symprune(*args)
    assert "resuming from checkpoint" in resumed.stderr
    r = read_json(report)
    assert "incomplete" not in r and r["perplexity"]["pruned"] > 1
    assert (tmp_path / "run.h5.done").exists()


def test_a_long_evaluation_under_a_checkpoint_stops_within_a_batch(stories, tmp_path):
    """25 batches of 128 chunks, each first waiting 60 s for a signal: the run stops at the batch after the
    signal's (exit 75, no perplexity yet), where it used to finish the whole dense evaluation first."""
    out, report, checkpoint = tmp_path / "out", tmp_path / "r.json", tmp_path / "run.h5"
    args = prune_args(stories, out, "--eval", stories.second, "--eval-seqlen", "64", "--report", report,
                      "--checkpoint", checkpoint)
    run = Run(args, env={"SYMPRUNE_FAULT": "eval_batch:dense:sleep=60"})
    run.wait_for(f"wrote {out}")
    run.proc.send_signal(signal.SIGUSR1)
    assert run.finish() == 75, run.stderr
    r = read_json(report)
    assert r["incomplete"] == "dense and pruned evaluation interrupted by SIGUSR1" and "perplexity" not in r, r


def test_a_closed_log_pipe_does_not_kill_the_run(stories, tmp_path):
    """`symprune ... 2>&1 | head -1`: SIGPIPE used to end the run unfinished (exit 141), its lock file left."""
    out = tmp_path / "out"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads the log
    proc = subprocess.run([BIN, *map(str, prune_args(stories, out, "--log-level", "debug"))], stdout=write_end,
                          stderr=write_end)
    os.close(write_end)
    assert proc.returncode == 0
    assert (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- numbers and usability -------------------------------------------------------------------------

def test_negative_seed_follows_python(stories, tmp_path):
    """random.seed(-1) == random.seed(1): the same windows, the same pruned model."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    symprune(*prune_args(stories, a, "--seed", "-1"))
    symprune(*prune_args(stories, b, "--seed", "1"))
    symprune(*prune_args(stories, c, "--seed", "2"))
    assert output_digest(a) == output_digest(b)
    assert output_digest(a) != output_digest(c)


@pytest.mark.parametrize("args,message", [
    (["--threads", "100000"], "--threads 100000: use 0 (automatic: one per CPU) or 1.."),
    (["--nsamples", "18446744073709551616"], "is outside the range of a 64-bit integer"),
    (["--nsamples", "0x10"], "'0x10' is not an integer"),
    (["--alpha", "nan"], "'nan' is not a number"),
    (["--sparsity", "inf"], "'inf' is not a finite number"),
    # CLI11 reads an empty number as 0: a dense copy, or wanda turned into magnitude by --alpha "".
    (["--sparsity", ""], "--sparsity: an empty value (an unset variable in a script?)"),
    (["--alpha", ""], "--alpha: an empty value (an unset variable in a script?)"),
    (["--alpha", " "], "--alpha: an empty value is not a number"),
    (["--nsamples", "100000000"], "of host memory (weights and head "),
])
def test_bad_numbers_are_refused_with_a_message(stories, tmp_path, args, message):
    start = time.time()
    proc = symprune(*prune_args(stories, tmp_path / "out", *args), check=False)
    assert proc.returncode == 1, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert time.time() - start < 30 and listing(tmp_path) == []


# Paths given "" used to mean "not given": a run without the checkpoint, report or evaluation a script asked
# for through an unset variable, with exit 0.
@pytest.mark.parametrize("command,option", [
    ("prune", "--checkpoint"), ("prune", "--report"), ("prune", "--eval"), ("prune", "--tokenizer"),
    ("prune", "--resume"), ("prune", "--calib"), ("prune", "--recipe"), ("prune", "--model"),
    ("eval", "--report"), ("eval", "--tokenizer"), ("calib", "--out"), ("tokenize", "--text-file"),
])
def test_an_empty_value_is_refused_not_taken_as_absent(stories, tmp_path, command, option):
    out = tmp_path / "out"
    given = {
        "prune": {"--model": stories.model, "--method": "wanda", "--sparsity": "0.5", "--nsamples": "8",
                  "--seqlen": "64", "--calib": stories.first, "--out": out},
        "eval": {"--model": stories.model, "--text": stories.second, "--max-chunks": "2"},
        "calib": {"--tokenizer": stories.model, "--calib": stories.first, "--out": out},
        "tokenize": {"--tokenizer": stories.model},
    }[command]
    given[option] = ""
    proc = symprune(command, *[str(word) for pair in given.items() for word in pair], check=False)
    assert proc.returncode == 1, proc.stderr
    end = "give one" if option == "--model" else "give one, or leave the option out"
    assert f"{option}: an empty value (an unset variable in a script?): {end}\n" in proc.stderr, proc.stderr
    assert listing(tmp_path) == []


def test_an_empty_value_in_a_recipe_is_refused_and_an_empty_text_is_tokenized(stories, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('checkpoint = ""\n')
    proc = symprune(*prune_args(stories, tmp_path / "out", "--recipe", recipe), check=False)
    assert proc.returncode == 1 and "--checkpoint: an empty value" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.toml"]
    assert symprune("tokenize", "--tokenizer", stories.model, "--text", "").stdout.split() == ["1"]


def test_log_levels_are_the_six_documented_names(stories, tmp_path):
    """spdlog's own aliases (warning, err, critical) used to pass; an empty SYMPRUNE_LOG_LEVEL was an error: it
    counts as unset, as an empty environment variable does (an empty --log-level is refused, E-OPT-EMPTY)."""
    for level in ("warning", "err", "critical", "WARN"):
        proc = symprune("--log-level", level, "info", check=False)
        assert proc.returncode == 1 and f"unknown log level '{level}'" in proc.stderr, (level, proc.stderr)
    proc = symprune("info", env={"SYMPRUNE_LOG_LEVEL": ""})
    assert proc.returncode == 0, proc.stderr


def test_leading_zeros_are_decimal(stories, tmp_path):
    symprune(*prune_args(stories, tmp_path / "out", "--nsamples", "010", "--report", tmp_path / "r.json"))
    assert read_json(tmp_path / "r.json")["config"]["nsamples"] == 10


def test_version_log_level_anywhere_and_progress_with_eta(stories, tmp_path):
    version = symprune("--version")
    assert version.stdout.startswith("symprune ") and "commit " in version.stdout
    quiet = symprune(*prune_args(stories, tmp_path / "q", "--log-level", "warn"))
    assert "block 1/" not in quiet.stderr
    proc = symprune(*prune_args(stories, tmp_path / "out", "--eval", stories.second, "--eval-seqlen", "64",
                                "--eval-max-chunks", "40", "--report", tmp_path / "r.json"))
    assert "block 1/5 done in" in proc.stderr and "ETA" in proc.stderr
    assert "dense perplexity: chunks" in proc.stderr and "pruned perplexity: chunks" in proc.stderr
    report = read_json(tmp_path / "r.json")
    assert report["timings"]["eval_dense"] > 0 and report["timings"]["eval_pruned"] > 0
    assert report["symprune"]["version"] in version.stdout
    provenance = read_json(tmp_path / "out" / PROVENANCE)
    assert provenance["commit"] == report["symprune"]["commit"]
    assert provenance["config"] == report["config"]
    assert provenance["fingerprints"] == report["fingerprints"]
    # The command as given, and where: the configuration's relative paths are relative to it.
    assert provenance["command_line"][1:] == [str(a) for a in prune_args(stories, tmp_path / "out", "--eval",
                                                                           stories.second, "--eval-seqlen", "64",
                                                                           "--eval-max-chunks", "40", "--report",
                                                                           tmp_path / "r.json")]
    assert provenance["working_directory"] == os.getcwd()


def test_help_shows_both_switch_spellings_without_a_misleading_default(stories):
    text = symprune("prune", "--help").stdout
    assert "{false}" not in text
    assert "--no-grow-relative" in text and "relative factor in the regrow key (default on)" in text


@pytest.mark.parametrize("command", ["prune", "eval", "inspect", "logits"])
def test_every_model_option_names_the_synthetic_shapes(command):
    """E-MODEL-SYNTHETIC-UNKNOWN's fix points at --help: prune's and inspect's --model did not mention them."""
    text = " ".join(symprune(command, "--help").stdout.split())
    assert "synthetic:<shape>[:seed][:layers=<n>]" in text and "llama2-70b" in text and "tiny-opt" in text, text


@pytest.mark.parametrize("option", ["--calib", "--eval"])
def test_sigterm_stops_a_run_waiting_for_a_fifo_nobody_writes_to(stories, tmp_path, option):
    """A FIFO without a writer held the run in open(2), where SIGTERM (Slurm's scancel) could not stop it."""
    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    args = prune_args(stories, tmp_path / "out", "--eval-seqlen", "64")
    if option == "--calib":
        args[args.index("--calib") + 1] = fifo
    else:
        args += ["--eval", fifo]
    run = Run(args)
    deadline = time.time() + 60
    while not any(os.path.realpath(fd) == str(fifo) for fd in Path(f"/proc/{run.proc.pid}/fd").glob("*")):
        assert time.time() < deadline and run.proc.poll() is None, "".join(run.lines)
        time.sleep(0.05)
    time.sleep(0.3)  # into the wait for the writer
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=30) == 143, run.stderr
    assert "interrupted by SIGTERM" in run.stderr and listing(tmp_path) == ["text.fifo"]


def test_a_fifo_whose_writer_comes_later_is_read(stories, tmp_path):
    fifo = tmp_path / "calib.fifo"
    os.mkfifo(fifo)
    args = prune_args(stories, tmp_path / "out")
    args[args.index("--calib") + 1] = fifo
    run = Run(args)
    time.sleep(1.0)  # the run waits for the writer: opening the FIFO no longer does
    with open(fifo, "wb") as writer:
        writer.write(Path(stories.first).read_bytes())
    assert run.finish(timeout=300) == 0, run.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_paths_that_are_not_utf8_are_recorded_escaped(stories, tmp_path):
    """JSON holds UTF-8 only: an --out with a Latin-1 byte made writing the provenance throw after the work."""
    out = os.fsencode(tmp_path) + b"/pruned\xe9"
    report = os.fsencode(tmp_path) + b"/r\xe9.json"
    args = [os.fsencode(str(a)) for a in prune_args(stories, tmp_path / "unused")]
    args[args.index(b"--out") + 1] = out
    proc = subprocess.run([os.fsencode(BIN), *args, b"--report", report], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    provenance = json.loads(Path(os.fsdecode(out), PROVENANCE).read_text())
    assert provenance["config"]["out"] == f"{tmp_path}/pruned\\xE9"
    assert provenance["command_line"][-1] == f"{tmp_path}/r\\xE9.json"
    assert json.loads(Path(os.fsdecode(report)).read_text())["config"]["out"] == f"{tmp_path}/pruned\\xE9"
