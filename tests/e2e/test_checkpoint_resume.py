"""Restartable runs (issue 11) in one process: --checkpoint/--resume give byte-identical outputs after kills at
any block, during a checkpoint's write and after the output was installed; SIGUSR1 saves and exits 75; corrupt,
foreign and impossible checkpoints get clear errors or a fallback to FILE.prev, and nothing at --out. The same
with several ranks and a different rank count on resume: tests/mpi/test_dist_checkpoint.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from prune_support import BIN, assert_same_as_uninterrupted, output_digest, stories_job, symprune, \
    uninterrupted_run

RUN = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "16", "--seqlen", "64", "--micro-batch", "3",
       "--eval-seqlen", "64", "--eval-max-chunks", "12"]
DATASETS = ["state", "masks", "calib_hidden", "eval_dense_hidden", "eval_pruned_hidden"]


@pytest.fixture(scope="module")
def job(stories):
    return stories_job(stories, *RUN)


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    """The uninterrupted run: its output digest and report."""
    return uninterrupted_run(job, tmp_path_factory.mktemp("reference"))


def replaced(args, option, value):
    """`args` with `option`'s value replaced."""
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def killed_run(job, tmp_path, fault, every=1):
    """A run killed (std::abort) at `fault`; returns the checkpoint path."""
    ckpt = tmp_path / "run.h5"
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", ckpt, "--checkpoint-every", every,
                    check=False, env={"SYMPRUNE_FAULT": f"{fault}:abort"})
    assert proc.returncode != 0 and proc.returncode not in (1, 75), proc.stderr
    assert not (tmp_path / "out").exists()
    return ckpt


def resume(job, tmp_path, *extra, check=True):
    return symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "run.h5", "--resume",
                    "auto", "--report", tmp_path / "report.json", *extra, check=check)


def finish_and_compare(job, tmp_path, reference, *extra):
    proc = resume(job, tmp_path, *extra)
    report = assert_same_as_uninterrupted(tmp_path, reference)
    # Each block's timings once, in order, the earlier attempts' ones from the checkpoint.
    assert [b["block"] for b in report["block_timings"]] == [b["block"] for b in reference[1]["block_timings"]]
    assert [b["block"] for b in report["block_timings"]] == list(range(len(report["block_timings"])))
    assert all(b["seconds"] >= b["blocks"] + b["scores_masks"] > 0 for b in report["block_timings"])
    # The run finished: the marker replaces the checkpoints.
    assert (tmp_path / "run.h5.done").exists() and not (tmp_path / "run.h5").exists()
    assert not (tmp_path / "run.h5.prev").exists() and not (tmp_path / "run.h5.tmp").exists()
    # inspect reads the marker as one (it used to call it a corrupt HDF5 checkpoint).
    marker = symprune("inspect", tmp_path / "run.h5.done").stdout
    assert f"completion marker: {tmp_path / 'run.h5.done'}" in marker and f"output: {tmp_path / 'out'}" in marker
    return proc, report


def test_a_completion_marker_that_cannot_be_written_keeps_the_outputs_and_the_checkpoint(job, reference,
                                                                                         tmp_path):
    """The marker is written after the model and the report: failing to write it (a full disk) used to end the
    run with exit 1 and the complete outputs left behind. The run has finished: exit 0 with a warning, the
    checkpoint kept, from which the same command writes the same outputs again."""
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "run.h5", "--report",
                    tmp_path / "report.json", env={"SYMPRUNE_FAULT": "marker:error"})
    assert "the run is complete, but its completion marker could not be written (injected fault at marker" \
        in proc.stderr, proc.stderr
    assert output_digest(tmp_path / "out") == reference[0]
    assert (tmp_path / "run.h5").exists() and not (tmp_path / "run.h5.done").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "report.json", "run.h5", "run.h5.prev"]
    finish_and_compare(job, tmp_path, reference)


@pytest.mark.parametrize("block", [2, 3, 4])
def test_a_run_killed_at_a_block_resumes_to_the_same_bytes(job, reference, tmp_path, block):
    killed_run(job, tmp_path, f"block:{block}")
    proc, report = finish_and_compare(job, tmp_path, reference)
    # Killed at the start of block k: the checkpoint of blocks 1..k may still have been in flight.
    assert report["resumed"]["block"] in (block - 1, block)
    assert "resuming from checkpoint" in proc.stderr


def test_a_checkpoint_becomes_the_file_during_the_next_block_once_written(job, reference, tmp_path):
    # Block 2 (1-based) is held 3 s at its start, so the checkpoint of block 1 is written by the time block 2's
    # dense pass ends; the kill comes after block 2's masks. The checkpoint was FILE by then: it used to be
    # installed only at the end of block 2, so that such a kill lost block 1 as well.
    ckpt = tmp_path / "run.h5"
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", ckpt, check=False,
                    env={"SYMPRUNE_FAULT": "block:1:busy=3,masks_done:1:exit=137"})
    assert proc.returncode == 137, proc.stderr
    assert "blocks 1..1 of 5 saved" in proc.stderr and ckpt.exists()
    with h5py.File(ckpt, "r") as f:
        assert int(f.attrs["next_block"]) == 1
    _, report = finish_and_compare(job, tmp_path, reference)
    assert report["resumed"]["block"] == 1


def test_checkpoint_every_two_blocks(job, reference, tmp_path):
    killed_run(job, tmp_path, "block:4", every=2)
    _, report = finish_and_compare(job, tmp_path, reference, "--checkpoint-every", "2")
    assert report["resumed"]["block"] in (2, 4)


def test_a_kill_during_a_checkpoint_write_falls_back_to_the_complete_one(job, reference, tmp_path):
    # The first checkpoint is written whole; the process dies while writing the second.
    ckpt = tmp_path / "run.h5"
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", ckpt, check=False,
                    env={"SYMPRUNE_FAULT": "checkpoint_write:2:exit=137"})
    assert proc.returncode == 137
    assert ckpt.exists() and (tmp_path / "run.h5.tmp").exists()
    _, report = finish_and_compare(job, tmp_path, reference)
    assert report["resumed"]["block"] == 1
    assert "run.h5.tmp" not in str(list(tmp_path.iterdir()))


def test_a_kill_after_the_output_was_installed_finishes_the_run(job, reference, tmp_path):
    ckpt = tmp_path / "run.h5"
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", ckpt, check=False,
                    env={"SYMPRUNE_FAULT": "pruned_eval:exit=137"})
    assert proc.returncode == 137 and (tmp_path / "out").exists()
    # --out exists, written by this very run (its provenance names the run): the resumed run may replace it.
    proc, report = finish_and_compare(job, tmp_path, reference)
    assert report["resumed"]["block"] == 5


def started_until_first_checkpoint(job, tmp_path, fault):
    """A run with --checkpoint tmp_path/run.h5 started in the background, returned once its first checkpoint
    is installed (blocks 1..1 done, during block 2)."""
    ckpt = tmp_path / "run.h5"
    command = [BIN, "prune", *map(str, job), "--out", str(tmp_path / "out"), "--checkpoint", str(ckpt)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SYMPRUNE_FAULT": fault})
    deadline = time.time() + 60
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.02)
    return proc


def test_a_second_run_on_a_running_runs_checkpoint_is_refused_and_harms_nothing(job, reference, tmp_path):
    # Its check that checkpoints can be written there used to create and remove FILE.tmp: the first run's
    # checkpoint in the making, which then could not be installed.
    ckpt, staging = tmp_path / "run.h5", tmp_path / "run.h5.tmp"
    command = [BIN, "prune", *map(str, job), "--out", str(tmp_path / "out"), "--checkpoint", str(ckpt)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "SYMPRUNE_FAULT": "checkpoint_write:2:sleep=4"})
    deadline = time.time() + 60
    while not (ckpt.exists() and staging.exists()) and time.time() < deadline:
        time.sleep(0.02)
    assert staging.exists()
    second = symprune("prune", *job, "--out", tmp_path / "other", "--checkpoint", ckpt, "--resume", "auto",
                      check=False)
    assert second.returncode == 1 and "is being written by another symprune run" in second.stderr, second.stderr
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert output_digest(tmp_path / "out") == reference[0] and not (tmp_path / "other").exists()


def test_sigusr1_saves_the_next_block_and_exits_75(job, reference, tmp_path):
    # The first checkpoint is installed during block 2 (1-based): the signal lands during block 2, at its end
    # or during block 3 (held 2 s at its start), and the run stops at the boundary after it.
    proc = started_until_first_checkpoint(job, tmp_path, "block:2:busy=2")
    proc.send_signal(signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr
    saved = re.search(r"interrupted by SIGUSR1: blocks 1\.\.(\d) of 5 are saved in checkpoint", stderr)
    assert saved and int(saved.group(1)) in (2, 3), stderr
    assert not (tmp_path / "out").exists()
    _, report = finish_and_compare(job, tmp_path, reference)
    assert report["resumed"]["block"] == int(saved.group(1))


def test_a_real_sigkill_mid_run_resumes_to_the_same_bytes(job, reference, tmp_path):
    proc = started_until_first_checkpoint(job, tmp_path, "block:3:busy=2")
    time.sleep(0.3)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (tmp_path / "out").exists()
    finish_and_compare(job, tmp_path, reference)


def test_a_finished_run_is_not_redone(job, reference, tmp_path):
    killed_run(job, tmp_path, "block:3")
    finish_and_compare(job, tmp_path, reference)
    before = (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns
    proc = resume(job, tmp_path)
    assert "already complete" in proc.stdout
    assert (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns == before
    # The same checkpoint path with other options: that is another run, refused.
    other = resume(replaced(job, "--sparsity", "0.6"), tmp_path, check=False)
    assert other.returncode == 1 and "config.sparsity: the checkpoint has 0.5, this run has 0.6" in other.stderr
    # Its weights removed from --out (the provenance file kept): not "already complete" any more.
    (tmp_path / "out" / "model.safetensors").unlink()
    gone = resume(job, tmp_path, check=False)
    assert gone.returncode == 1 and "(model.safetensors is missing): remove the marker to run again" in gone.stderr


def test_a_finished_run_found_again_refuses_an_input_named_like_its_locks(job, tmp_path):
    # The "already complete" path takes the checkpoint's and the output's locks (writing a pid into them, then
    # removing them): an input under either name is refused first. A copy of the calibration text has the
    # same fingerprint, so the run is the finished one.
    resume(job, tmp_path)
    calib = Path(job[job.index("--calib") + 1])
    for lock in (".run.h5.lock", ".out.lock"):
        shutil.copy(calib, tmp_path / lock)
        proc = resume(replaced(job, "--calib", tmp_path / lock), tmp_path, check=False)
        assert proc.returncode == 1, proc.stderr
        assert f"its lock file {tmp_path / lock} is the input file" in proc.stderr, proc.stderr
        assert (tmp_path / lock).read_bytes() == calib.read_bytes()
        (tmp_path / lock).unlink()
    assert "already complete" in resume(job, tmp_path).stdout


def test_checkpoints_left_by_a_kill_after_the_marker_are_removed_by_the_next_start(job, reference, tmp_path):
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "run.h5", "--resume",
                    "auto", "--report", tmp_path / "report.json", check=False,
                    env={"SYMPRUNE_FAULT": "marker_written:exit=137"})
    assert proc.returncode == 137 and (tmp_path / "run.h5.done").exists() and (tmp_path / "run.h5").exists()
    assert output_digest(tmp_path / "out") == reference[0]
    proc = resume(job, tmp_path)
    assert "already complete" in proc.stdout
    assert f"removed {tmp_path / 'run.h5'}, left by this run after it had finished" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "report.json", "run.h5.done"]


def copy_state(tmp_path, name):
    """A copy of tmp_path's killed run (checkpoints only) under `name`."""
    target = tmp_path / name
    target.mkdir()
    for f in tmp_path.glob("run.h5*"):
        shutil.copy(f, target / f.name)
    return target


@pytest.fixture()
def killed(job, tmp_path):
    killed_run(job, tmp_path, "block:4")
    (tmp_path / "run.h5.tmp").unlink(missing_ok=True)
    return tmp_path


def refused(job, run_dir, *needles):
    proc = resume(job, run_dir, check=False)
    assert proc.returncode == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (run_dir / "out").exists() and not (run_dir / "report.json").exists()
    return proc


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_flipped_bit_in_any_dataset_is_detected(job, reference, killed, dataset):
    bad = copy_state(killed, f"flip-{dataset}")
    with h5py.File(bad / "run.h5", "r+") as f:
        data = f[dataset][...]
        flat = data.reshape(-1).view(np.uint8)
        flat[flat.size // 3] ^= 0x10
        f[dataset][...] = data
    proc = symprune("inspect", bad / "run.h5", check=False)
    assert proc.returncode == 1 and "checksums: FAILED" in proc.stdout
    # The problem names the file once (it used to read "checkpoint F is corrupt: checkpoint F: dataset ...").
    assert proc.stderr.count(str(bad / "run.h5")) == 1, proc.stderr
    (bad / "run.h5.prev").unlink()
    refused(job, bad, f"dataset {dataset} is corrupt: checksum mismatch", "no usable checkpoint")


def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(job, reference, killed):
    run = copy_state(killed, "fallback")
    with h5py.File(run / "run.h5", "r+") as f:
        data = f["calib_hidden"][...]
        data[0, 0, 0] += 1.0
        f["calib_hidden"][...] = data
    proc, report = finish_and_compare(job, run, reference)
    assert "checksum mismatch" in proc.stderr and "trying the previous checkpoint" in proc.stderr
    assert report["resumed"]["checkpoint"].endswith("run.h5.prev")


def test_a_truncated_checkpoint_is_refused(job, killed):
    run = copy_state(killed, "truncated")
    size = (run / "run.h5").stat().st_size
    with open(run / "run.h5", "r+b") as f:
        f.truncate(size // 2)
    (run / "run.h5.prev").unlink()
    refused(job, run, "run.h5: not a readable HDF5 file (truncated or corrupt?)")


def test_another_format_version_is_refused(job, killed):
    run = copy_state(killed, "version")
    with h5py.File(run / "run.h5", "r+") as f:
        f.attrs.modify("version", np.int64(2))
    (run / "run.h5.prev").unlink()
    refused(job, run, "format version 2, but this symprune reads version 1")


def test_an_edited_header_attribute_is_caught_by_the_checksummed_state(job, reference, killed):
    """next_block (outside every checksum) said 3 of a checkpoint of blocks 1..2: before, the run resumed at
    block 4 with block 3 dense, exit 0. Now the header is compared with the state's copy of it."""
    run = copy_state(killed, "header")
    with h5py.File(run / "run.h5", "r") as f:
        done = int(f.attrs["next_block"])
    with h5py.File(run / "run.h5", "r+") as f:
        f.attrs.modify("next_block", np.int64(done + 1))
    proc = symprune("inspect", run / "run.h5", check=False)
    assert proc.returncode == 1 and "disagrees with its checksummed state" in proc.stderr + proc.stdout
    proc, report = finish_and_compare(job, run, reference)
    assert f"its header (blocks 1..{done + 1} of 5 done" in proc.stderr
    assert "trying the previous checkpoint" in proc.stderr
    assert report["resumed"]["checkpoint"].endswith("run.h5.prev")


def test_a_checkpoint_resumed_through_a_symbolic_link_is_replaced_where_it_lies(job, reference, killed,
                                                                             tmp_path_factory):
    """--checkpoint LINK -> the killed run's run.h5: its successors, .prev and the marker go beside the file,
    and the finished run leaves no checkpoint data there (before, the link was replaced and the target, a
    whole checkpoint, was left behind)."""
    elsewhere = tmp_path_factory.mktemp("link")
    (elsewhere / "run.h5").symlink_to(killed / "run.h5")
    proc = symprune("prune", *job, "--out", elsewhere / "out", "--checkpoint", elsewhere / "run.h5", "--resume",
                    "auto")
    assert "resuming from checkpoint" in proc.stderr
    assert output_digest(elsewhere / "out") == reference[0]
    assert (killed / "run.h5.done").exists()
    assert sorted(p.name for p in killed.glob("run.h5*")) == ["run.h5.done"]
    assert (elsewhere / "run.h5").is_symlink()  # the user's link, untouched


def test_a_checkpoint_it_may_not_read_is_refused_not_skipped(job, killed):
    """Permission denied is not corruption: before, the run fell back to FILE.prev (a block lost) and its next
    save replaced the unreadable newer checkpoint. Run as another user when root (root reads any file), in a
    directory that user can reach, with the inputs copied there (their fingerprints, not paths, are checked)."""
    place = Path(tempfile.mkdtemp(prefix="symprune-permission-"))
    try:
        place.chmod(0o755)
        args = list(job)
        for option in ("--model", "--calib", "--eval"):
            source = Path(args[args.index(option) + 1])
            target = place / source.name
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
            args[args.index(option) + 1] = target
        for f in ("run.h5", "run.h5.prev"):
            shutil.copy(killed / f, place / f)
        prefix = []
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "65534:65534", place], check=True)
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        (place / "run.h5").chmod(0)
        proc = subprocess.run([*prefix, BIN, "prune", *map(str, args), "--out", place / "out", "--checkpoint",
                               place / "run.h5", "--resume", "auto"], capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        assert "run.h5: cannot be read: Permission denied" in proc.stderr, proc.stderr
        assert "nothing was removed" in proc.stderr and "trying the previous checkpoint" not in proc.stderr
        assert (place / "run.h5").exists() and (place / "run.h5.prev").exists() and not (place / "out").exists()
    finally:
        (place / "run.h5").chmod(0o644)
        shutil.rmtree(place, ignore_errors=True)


def test_a_checkpoint_of_other_options_or_another_model_is_refused(job, stories, killed):
    run = copy_state(killed, "options")
    proc = symprune("prune", *replaced(job, "--nsamples", "15"), "--out", run / "out", "--checkpoint", run / "run.h5",
                    "--resume", "auto", check=False)
    assert proc.returncode == 1
    assert "was made by a different run and cannot continue this one: config.nsamples: the checkpoint has 16, " \
           "this run has 15" in proc.stderr
    model = killed / "model-copy"
    shutil.copytree(stories.model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config, indent=1))  # same model, other bytes
    other = replaced(job, "--model", model)
    proc = symprune("prune", *other, "--out", run / "out", "--checkpoint", run / "run.h5", "--resume", "auto",
                    check=False)
    assert proc.returncode == 1 and "fingerprints.model: the checkpoint has" in proc.stderr
    assert not (run / "out").exists()


def test_impossible_checkpoint_places_fail_before_the_first_block(job, tmp_path):
    out = tmp_path / "out"
    full = symprune("prune", *job, "--out", out, "--checkpoint", tmp_path / "c.h5", check=False,
                    env={"SYMPRUNE_DISK_AVAILABLE": "100000"})
    assert full.returncode == 1 and "needs" in full.stderr and "free, but has" in full.stderr
    assert "block 1/" not in full.stderr and not out.exists()
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    target = readonly / "c.h5" if os.geteuid() != 0 else "/sys/symprune-test.h5"
    proc = symprune("prune", *job, "--out", out, "--checkpoint", target, check=False)
    assert proc.returncode == 1 and "cannot write checkpoints there" in proc.stderr
    assert "block 1/" not in proc.stderr and not out.exists()


def test_a_killed_writes_checkpoint_staging_file_counts_as_free_space(job, tmp_path):
    """A run killed while writing a checkpoint leaves FILE.tmp, which the next checkpoint replaces: its space
    is the resumed run's (it was refused for ever on a disk sized for the run)."""
    small = {"SYMPRUNE_DISK_AVAILABLE": "100000"}
    refused = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "c.h5", check=False,
                       env=small)
    assert refused.returncode == 1 and "free, but has 97.7 KiB" in refused.stderr, refused.stderr
    with open(tmp_path / "c.h5.tmp", "wb") as stale:
        stale.write(os.urandom(64 << 20))  # incompressible: its blocks are its size on any file system
    symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "c.h5", env=small)
    assert not (tmp_path / "c.h5.tmp").exists() and (tmp_path / "c.h5.done").exists()


def test_a_previous_checkpoint_that_is_not_a_file_is_refused_before_the_first_block(job, killed):
    """It used to be found only when the first checkpoint was kept, a block later, leaving a whole FILE.tmp."""
    run = copy_state(killed, "prev-dir")
    (run / "run.h5.prev").unlink(missing_ok=True)
    (run / "run.h5.prev").mkdir()
    proc = resume(job, run, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write checkpoints there ({run / 'run.h5.prev'}: Is a directory)" in proc.stderr
    assert "block 5/" not in proc.stderr and not (run / "out").exists() and not (run / "run.h5.tmp").exists()


def test_checkpoint_option_errors(job, tmp_path):
    cases = [
        (["--checkpoint-every", "0", "--checkpoint", tmp_path / "c.h5"], "--checkpoint-every must be at least 1"),
        (["--resume", "auto"], "--resume auto continues the checkpoint named by --checkpoint FILE"),
        (["--resume", tmp_path / "missing.h5"], "no such checkpoint"),
    ]
    for extra, message in cases:
        proc = symprune("prune", *job, "--out", tmp_path / "out", *extra, check=False)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    (tmp_path / "c.h5").write_text("x")
    proc = symprune("prune", *job, "--out", tmp_path / "out", "--checkpoint", tmp_path / "c.h5", check=False)
    assert proc.returncode == 1 and "exists, from an earlier run: continue that run with --resume auto" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_inspect_describes_a_checkpoint(job, killed):
    proc = symprune("inspect", killed / "run.h5")
    assert "format: symprune-checkpoint version 1" in proc.stdout
    assert "blocks done: 3 of 5" in proc.stdout or "blocks done: 4 of 5" in proc.stdout
    assert "checksums: all verify" in proc.stdout
    for name in DATASETS:
        assert f"\n{name} " in proc.stdout
    assert '"method":"wanda"' in proc.stdout
