"""Checkpoints with several ranks (issue 11): runs killed (one rank, all ranks, during a checkpoint's write)
or stopped by SIGUSR1 resume with the same or another number of ranks, or with one `symprune prune` process,
to outputs byte-identical to an uninterrupted single-process run, with the same perplexities."""
import json
import os
import re
import shlex
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from conftest import DIST, MPI_ENV, MPIEXEC, launcher, mpirun
from prune_support import Run, output_digest, sharded_stories, stories_job, symprune, uninterrupted_run

RUN = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "16", "--seqlen", "64", "--micro-batch", "3",
       "--eval-seqlen", "64", "--eval-max-chunks", "20", "--threads", "1"]


@pytest.fixture(scope="module")
def job(stories):
    return stories_job(stories, *RUN)


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    digest, report = uninterrupted_run(job, tmp_path_factory.mktemp("reference"))
    return digest, report["perplexity"]


def checkpoint_args(run_dir):
    return ["--out", run_dir / "out", "--checkpoint", run_dir / "run.h5", "--report", run_dir / "report.json"]


def resume_and_compare(job, run_dir, reference, ranks):
    """Resumes with `ranks` MPI ranks (0: one symprune prune process) and checks the result."""
    args = [*job, *checkpoint_args(run_dir), "--resume", "auto"]
    if ranks == 0:
        proc = symprune("prune", *args)
    else:
        proc = mpirun(ranks, *args)
        assert proc.returncode == 0, proc.stderr
    assert "resuming from checkpoint" in proc.stderr
    assert output_digest(run_dir / "out") == reference[0]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["perplexity"] == reference[1]
    assert report["resumed"] is not None and (run_dir / "run.h5.done").exists()
    return report


def test_a_failed_write_on_another_rank_leaves_no_staging_file(job, reference, tmp_path, have_mpirun):
    """Rank 1's part of the second checkpoint fails (a full disk, a file size limit): every rank ends with
    its message, the first checkpoint is kept, and FILE.tmp is removed (it was left before: rank 0's own
    cleanup covered only its own failures)."""
    proc = mpirun(2, *job, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": "checkpoint_write:2@1:error"},
                  timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "injected fault at checkpoint_write:2" in proc.stderr
    assert (tmp_path / "run.h5").exists() and not (tmp_path / "run.h5.tmp").exists()
    assert not (tmp_path / "out").exists()
    resume_and_compare(job, tmp_path, reference, 2)


@pytest.mark.parametrize("fault,ranks,resume_ranks", [
    ("block:3@1:abort", 3, 2),       # one rank dies; fewer ranks continue
    ("block:3:abort", 2, 3),         # every rank dies; more ranks continue
    ("block:4@0:exit=137", 3, 0),    # rank 0 killed; one process continues
    ("checkpoint_write:3@1:exit=137", 2, 4),  # killed while writing a checkpoint
])
def test_killed_runs_resume_with_any_rank_count(job, reference, tmp_path, have_mpirun, fault, ranks,
                                                resume_ranks):
    proc = mpirun(ranks, *job, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": fault}, timeout=120)
    assert proc.returncode != 0 and not (tmp_path / "out").exists()
    assert (tmp_path / "run.h5").exists()
    resume_and_compare(job, tmp_path, reference, resume_ranks)


@pytest.mark.parametrize("fault,installed", [
    ("block:1:busy=3,masks_done:1:exit=137", True),             # every part written during block 2
    ("checkpoint_write:1@1:busy=6,masks_done:1:exit=137", False),  # rank 1's part still being written
])
def test_a_checkpoint_is_installed_during_the_next_block_once_every_ranks_part_is_written(
        job, reference, tmp_path, have_mpirun, fault, installed):
    """Between block 2's stages the ranks ask each other whether the checkpoint of block 1 is written: once
    every rank's part is, it becomes FILE, so a kill of every rank after block 2's masks keeps block 1. While
    one rank's part is still being written, it must not be installed (a FILE with rows missing)."""
    proc = mpirun(2, *job, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": fault}, timeout=120)
    assert proc.returncode != 0 and not (tmp_path / "out").exists()
    assert ("blocks 1..1 of 5 saved" in proc.stderr) == installed, proc.stderr
    assert (tmp_path / "run.h5").exists() == installed
    args = [*job, *checkpoint_args(tmp_path), "--resume", "auto"]
    proc = mpirun(3, *args)
    assert proc.returncode == 0, proc.stderr
    assert output_digest(tmp_path / "out") == reference[0]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["perplexity"] == reference[1]
    assert (report["resumed"] or {}).get("block") == (1 if installed else None)


def test_a_rank_without_calibration_windows_asks_for_the_checkpoint_with_the_others(stories, tmp_path,
                                                                                   have_mpirun):
    """4 windows in one micro-batch: rank 1 holds none and runs no pruned pass. It used to skip the question
    asked after that pass (a collective) while rank 1's part of a checkpoint was still being written, so the
    ranks' collectives went out of step (MPI_ERR_TRUNCATE, or a wrong answer)."""
    few = stories_job(stories, "--method", "wanda", "--sparsity", "0.5", "--nsamples", "4", "--seqlen", "64",
                      "--micro-batch", "4", "--eval-seqlen", "64", "--eval-max-chunks", "4", "--threads", "1")
    digest, report = uninterrupted_run(few, tmp_path / "reference")
    proc = mpirun(2, *few, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": "checkpoint_write:1@1:busy=2"},
                  timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert output_digest(tmp_path / "out") == digest
    assert json.loads((tmp_path / "report.json").read_text())["perplexity"] == report["perplexity"]


def test_a_resumed_run_reports_the_communication_of_every_attempt_once(job, tmp_path, have_mpirun):
    """Rank 0's volumes of a run killed after block 3 and resumed equal an uninterrupted run's on as many
    ranks: the weights broadcast used to be counted only at the end, so the killed attempt's were lost."""
    symprune_dir = tmp_path / "whole"
    symprune_dir.mkdir()
    proc = mpirun(2, *job, *checkpoint_args(symprune_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    whole = json.loads((symprune_dir / "report.json").read_text())["communication_bytes"]
    assert all(whole[k] > 0 for k in ("weights", "statistics", "masks", "eval")), whole
    proc = mpirun(2, *job, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": "block:3:abort"}, timeout=120)
    assert proc.returncode != 0 and (tmp_path / "run.h5").exists()
    proc = mpirun(2, *job, *checkpoint_args(tmp_path), "--resume", "auto", timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resumed"]["block"] in (2, 3)  # blocks 1..3 are saved, or not yet installed
    assert report["communication_bytes"] == whole


@pytest.mark.parametrize("ranks,resume_ranks", [(3, 2), (2, 3)])
def test_each_rank_keeps_saves_and_restores_the_masks_of_the_shards_it_writes(stories, tmp_path, have_mpirun,
                                                                             ranks, resume_ranks):
    """A three-shard copy of stories260K: a rank keeps only the mask bits of the tensors in the shards it
    writes (shard i: rank i mod R), and saves them into a segment of the checkpoint's masks dataset that
    starts on a checksum unit of its own. Killed in block 5 and resumed with another rank count (each rank
    reading the masks it now keeps, wherever they lie), the output is byte-identical to one process's, and
    the largest rank's host plan counts fewer mask bits than one process keeps. (Shards: the embeddings and
    blocks 1-2 in part; blocks 2-4 in part; blocks 4-5 and the final norm.)"""
    model, shards = sharded_stories(stories, tmp_path, 3)
    job = ["--model", model, "--calib", stories.first, "--eval", stories.second, *RUN]
    digest, whole = uninterrupted_run(job, tmp_path / "reference")
    run = tmp_path / "run"
    run.mkdir()
    # The checkpoint of blocks 1..4 is installed during block 5 (its writing has had 2 s), before the kill.
    proc = mpirun(ranks, *job, *checkpoint_args(run),
                  env={"SYMPRUNE_FAULT": "block:4:busy=2,masks_done:4:abort"}, timeout=120)
    assert proc.returncode != 0 and "blocks 1..4 of 5 saved" in proc.stderr, proc.stderr
    with h5py.File(run / "run.h5", "r") as f:
        state = json.loads(bytes(np.asarray(f["state"])).decode())
        dataset_bytes = f["masks"].shape[0]
    assert state["next_block"] == 4
    keeper = {name: i % ranks for i, names in enumerate(shards) for name in names}
    index = sorted(state["masks"], key=lambda m: m["offset"])
    assert len(index) == 7 * state["next_block"]
    segments = [[m for m in index if keeper[m["name"]] == r] for r in range(ranks)]
    assert all(segments), "every rank keeps some masks"
    for r, segment in enumerate(segments):
        assert [m["name"] for m in segment] == sorted(m["name"] for m in segment)  # name order
        start = segment[0]["offset"]
        assert start == 0 if r == 0 else start % (1 << 20) == 0, (r, start)
        for a, b in zip(segment, segment[1:]):  # back to back
            assert b["offset"] == a["offset"] + (a["rows"] * a["cols"] + 7) // 8
    last = index[-1]
    assert dataset_bytes == last["offset"] + (last["rows"] * last["cols"] + 7) // 8
    proc = mpirun(resume_ranks, *job, *checkpoint_args(run), "--resume", "auto", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert output_digest(run / "out") == digest
    report = json.loads((run / "report.json").read_text())
    assert report["perplexity"] == whole["perplexity"] and report["resumed"] is not None
    assert 0 < report["host_memory"]["plan"]["masks"] < whole["host_memory"]["plan"]["masks"]


def mpirun_with_rank_1_blind_to(directory, *args, timeout=120):
    """Two ranks, rank 1 in a mount namespace of its own where `directory` is empty: a checkpoint on
    node-local disk, seen from another node. Skips where mount namespaces are not allowed."""
    empty = directory.parent / "empty"
    empty.mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", empty, directory], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot bind-mount in a mount namespace here")
    line = " ".join(shlex.quote(str(a)) for a in [DIST, *args])
    command = [MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-n", "1", DIST, *map(str, args), ":", "-n", "1",
               "unshare", "-m", "sh", "-c", f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(directory))}"
               f" && exec {line}"]
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_checkpoint_only_some_ranks_see_is_one_agreed_error_not_a_hang(job, tmp_path, have_mpirun):
    """--resume auto looked for FILE and FILE.prev on each rank and went on with what it found: a rank that saw
    none started afresh (new collectives) while the others read the checkpoint. The same with the marker
    of a finished run: the ranks that saw it returned, the others waited for them."""
    run_dir = tmp_path / "node0"
    run_dir.mkdir()
    args = [*job, *checkpoint_args(run_dir), "--resume", "auto"]
    proc = mpirun(2, *job, *checkpoint_args(run_dir), env={"SYMPRUNE_FAULT": "block:3:abort"}, timeout=120)
    assert proc.returncode != 0 and (run_dir / "run.h5").exists()
    proc = mpirun_with_rank_1_blind_to(run_dir, *args)
    assert proc.returncode == 1, proc.stderr
    assert f"checkpoint {run_dir / 'run.h5'} is seen by rank(s) 0 but not by rank(s) 1: every rank must see " \
        "the same checkpoint files" in proc.stderr, proc.stderr
    assert "MPI_ABORT" not in proc.stderr
    assert mpirun(2, *args, timeout=120).returncode == 0  # finished where every rank sees it
    proc = mpirun_with_rank_1_blind_to(run_dir, *args)
    assert proc.returncode == 1, proc.stderr
    assert f"the marker of a finished run {run_dir / 'run.h5.done'} is seen by rank(s) 0 but not by rank(s) 1" \
        in proc.stderr, proc.stderr


def test_a_corrupt_checkpoint_is_reported_once_and_the_previous_one_used(job, reference, tmp_path, have_mpirun):
    """Every rank reads the corrupt file and agrees on the error; rank 0 alone says so (each rank did)."""
    import h5py
    proc = mpirun(2, *job, *checkpoint_args(tmp_path), env={"SYMPRUNE_FAULT": "block:4:abort"}, timeout=120)
    assert proc.returncode != 0 and (tmp_path / "run.h5.prev").exists()
    (tmp_path / "run.h5.tmp").unlink(missing_ok=True)
    with h5py.File(tmp_path / "run.h5", "r+") as f:
        data = f["calib_hidden"][...]
        data[0, 0, 0] += 1.0
        f["calib_hidden"][...] = data
    args = [*job, *checkpoint_args(tmp_path), "--resume", "auto"]
    proc = mpirun(3, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("trying the previous checkpoint") == 1, proc.stderr
    assert "checksum mismatch" in proc.stderr
    assert output_digest(tmp_path / "out") == reference[0]


def test_sigusr1_to_mpirun_saves_and_exits_75_then_resumes(job, reference, tmp_path, have_mpirun):
    command = [*launcher(3), *map(str, [*job, *checkpoint_args(tmp_path)])]
    env = {**os.environ, **MPI_ENV, "SYMPRUNE_FAULT": "block:2:busy=3"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while not (tmp_path / "run.h5").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr
    # Each rank's notice names the program and the rank, as its log lines do.
    for rank in range(3):
        assert f"symprune_dist [rank {rank}/3]: SIGUSR1 received: stopping at the next safe point" in stderr
    # The signal lands at the boundary after the first installed checkpoint or during the next block.
    saved = re.search(r"interrupted by SIGUSR1: blocks 1\.\.(\d) of 5 are saved in checkpoint", stderr)
    assert saved and int(saved.group(1)) in (2, 3), stderr
    assert not (tmp_path / "out").exists()
    report = resume_and_compare(job, tmp_path, reference, 2)
    assert report["resumed"]["block"] == int(saved.group(1))


LONG_EVAL = [*RUN[:RUN.index("--eval-max-chunks")], "--eval-max-chunks", "0"]  # 3110 chunks, 25 batches


@pytest.fixture(scope="module")
def long_eval_job(stories):
    return stories_job(stories, *LONG_EVAL)


@pytest.mark.parametrize("stage,checkpoint", [("dense", True), ("pruned", False)])
def test_the_ranks_agree_to_stop_a_long_evaluation_within_a_batch(stories, long_eval_job, tmp_path, have_mpirun,
                                                                 stage, checkpoint):
    """With several ranks an evaluation used to run to its end before they could agree to stop: a signal in
    the dense one took effect after it, one in the pruned one stopped nothing (exit 0). The ranks now agree
    before each batch. Rank 1 spends 2 s on each of its 13 batches whatever signal comes."""
    run_dir = tmp_path
    args = [*long_eval_job, "--out", run_dir / "out", "--report", run_dir / "report.json"]
    if checkpoint:
        args += ["--checkpoint", run_dir / "run.h5"]
    run = Run(args, env={**MPI_ENV, "SYMPRUNE_FAULT": f"eval_batch:{stage}@1:busy=2"}, launcher=launcher(2))
    run.wait_for(f"wrote {run_dir / 'out'}" if stage == "dense" else "scoring the pruned model's evaluation chunks")
    run.proc.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
    returncode = run.finish(timeout=120)
    stderr = run.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert (run_dir / "out" / "model.safetensors").exists()  # the model is complete and kept
    if stage == "dense":
        assert returncode == 75, stderr
        assert report["incomplete"] == "dense and pruned evaluation interrupted by SIGUSR1", report
        assert "perplexity" not in report
        assert "blocks 1..5 of 5 are saved in checkpoint" in stderr
        resumed = mpirun(3, *args, "--resume", "auto")
        assert resumed.returncode == 0, resumed.stderr
        report = json.loads((run_dir / "report.json").read_text())
        for model, which in ((stories.model, "dense"), (run_dir / "out", "pruned")):
            symprune("eval", "--model", model, "--text", stories.second, "--seqlen", "64", "--threads", "1",
                     "--report", run_dir / f"{which}.json")
            alone = json.loads((run_dir / f"{which}.json").read_text())["perplexity"]
            assert report["perplexity"][which] == pytest.approx(alone, rel=1e-6), (which, report["perplexity"])
        assert "incomplete" not in report and (run_dir / "run.h5.done").exists()
    else:
        assert returncode == 128 + signal.SIGUSR1, stderr
        assert report["incomplete"] == "pruned evaluation interrupted by SIGUSR1", report
        assert report["perplexity"]["dense"] > 1 and report["perplexity"]["pruned"] is None
        assert "arrived after the run's last safe point" not in stderr
