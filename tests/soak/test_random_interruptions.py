"""Soak test (labels soak, slow; not in the default run): restartable runs interrupted at random moments.

The checkpoint tests stop a run at named points (a block, a checkpoint write, after the output was installed).
This one sends signals at random times instead, so that it also lands where no fault point is: while a lock is
taken, a staging directory renamed, a report or marker written, a rank agreeing on a stop. Each trial runs
one command line again and again (`--resume auto`), interrupting most attempts after a random delay, until
an attempt finishes; then the outputs must be the uninterrupted run's bytes and nothing else may be left.

After every attempt:
  - its exit code is one the README lists for what it was sent (no crash, no error exit, no hang);
  - `--out`, when it exists, is the finished model (never a partial one), and the report, when it exists,
    is whole JSON.
After the last attempt: the model's digest, the report's perplexity, masks' counts and reconstruction errors
equal the uninterrupted run's, and the directory holds exactly the model, the report and the checkpoint's
completion marker (no lock, staging directory or checkpoint left by the killed attempts).

The model is stories260K in three shards, so that three ranks each keep the masks of one (ModelMasks).
Single process (`symprune prune`): SIGKILL, SIGTERM, SIGINT, SIGHUP or SIGUSR1 to the process, or two SIGTERMs
20 ms apart (the second stops at once). Several ranks (`mpirun -n 3 symprune_dist`): SIGUSR1 to mpirun
(forwarded to every rank), SIGTERM, two SIGTERMs or SIGKILL to one rank, SIGTERM to mpirun (its own abort).

Environment: SYMPRUNE_SOAK_TRIALS (trials per mode, default 25), SYMPRUNE_SOAK_SEED (default: from the
clock; printed, and a failure names it, for a rerun with the same draws).
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from prune_support import (BIN, Stories, assert_same_as_uninterrupted, output_digest,  # noqa: E402
                           sharded_stories, uninterrupted_run)

DIST = os.environ.get("SYMPRUNE_DIST_BIN", "")
MPIEXEC = os.environ.get("SYMPRUNE_MPIEXEC", "mpirun")
TRIALS = int(os.environ.get("SYMPRUNE_SOAK_TRIALS", "25"))
SEED = int(os.environ.get("SYMPRUNE_SOAK_SEED", str(time.time_ns() % 1_000_000)))
RUN = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "16", "--seqlen", "64", "--micro-batch", "3",
       "--eval-seqlen", "64", "--eval-max-chunks", "12", "--checkpoint-every", "1"]
ATTEMPT_TIMEOUT = 120  # seconds: an attempt that takes longer has hung
MAX_ATTEMPTS = 12      # interrupted ones; the next runs to its end


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    return Stories(tmp_path_factory.mktemp("stories"))


@pytest.fixture(scope="module")
def job(stories, tmp_path_factory):
    """stories260K in three shards: with three ranks each keeps, saves and restores the masks of its own."""
    model, _ = sharded_stories(stories, tmp_path_factory.mktemp("sharded"), 3)
    return ["--model", model, "--calib", stories.first, "--eval", stories.second, *RUN]


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    """(output digest, report) of the uninterrupted run."""
    return uninterrupted_run(job, tmp_path_factory.mktemp("reference"))


def descendants(pid):
    """The pids of every process below `pid` (mpirun's ranks), from /proc."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Mode:
    """How an attempt is started and which interruptions it may get, with the exit codes each allows."""

    def __init__(self, name, command, interruptions):
        self.name, self.command, self.interruptions = name, command, interruptions


def single_mode(job, root):
    command = [BIN, "prune", *map(str, job), *outputs(root)]
    # (what, target, allowed exit codes): 0 when the attempt had finished, or when the signal came after its
    # last safe point; 75 after saving; 128 + n (or killed by n: -n) when it came before the handlers were
    # installed or before the first checkpoint could be saved.
    stop = lambda sig: (sig.name, "self", {0, 75, 128 + sig, -sig})  # noqa: E731
    # Two SIGTERMs 20 ms apart: the second stops at once (exit 143), removing what is unfinished.
    return Mode("single", command, [("SIGKILL", "self", {0, -9}), stop(signal.SIGTERM), stop(signal.SIGINT),
                                    stop(signal.SIGHUP), stop(signal.SIGUSR1),
                                    ("SIGTERM*2", "self", {0, 75, 143, -15})])


def mpi_mode(job, root):
    command = [MPIEXEC, "-n", "3", "--oversubscribe", "--allow-run-as-root", DIST, *map(str, job),
               *outputs(root)]
    # SIGUSR1 to mpirun reaches every rank: 75 after saving, 0 when finished. A rank killed or stopped by
    # mpirun's abort makes mpirun exit non-zero (1, or the signal's code); one rank's SIGTERM is agreed on
    # by all ranks at the next stopping point (75), or, before its handlers exist, kills that rank.
    return Mode("mpi3", command, [("SIGUSR1", "mpirun", {0, 75, 128 + 10, -10}),
                                  ("SIGTERM", "rank", {0, 75, 1, 143, -15}),
                                  ("SIGKILL", "rank", {0, 1, 137, -9}),
                                  ("SIGTERM", "mpirun", {0, 1, 75, 143, -15}),
                                  ("SIGTERM*2", "rank", {0, 1, 75, 143, -15})])


def outputs(root):
    return ["--out", root / "out", "--report", root / "report.json", "--checkpoint", root / "run.h5",
            "--resume", "auto"]


def attempt(mode, delay, interruption, env):
    """Run once; after `delay` s send the interruption (None: run to the end). Returns (rc, stderr, sent)."""
    proc = subprocess.Popen(mode.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    sent = None
    if interruption is not None:
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            what, target, _ = interruption
            pid = proc.pid
            if target == "rank":
                ranks = descendants(proc.pid)
                pid = random.choice(ranks) if ranks else None
            if pid is not None:
                name, _, times = what.partition("*")
                try:
                    for number in range(int(times or 1)):
                        if number:
                            time.sleep(0.02)
                        os.kill(pid, getattr(signal, name))
                        sent = f"{what} to {target} at {delay:.3f} s"
                except ProcessLookupError:
                    pass
    try:
        _, stderr = proc.communicate(timeout=ATTEMPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        _, stderr = proc.communicate()
        raise AssertionError(f"an attempt hung ({sent}); stderr:\n{stderr[-3000:]}")
    return proc.returncode, stderr, sent


def check_outputs_whole(root, reference):
    """What exists of the outputs after any attempt is complete."""
    if (root / "out").exists():
        assert output_digest(root / "out") == reference[0], "a partial or different model at --out"
    if (root / "report.json").exists():
        json.loads((root / "report.json").read_text())


def check_finished(root, reference):
    report = assert_same_as_uninterrupted(root, reference)
    assert "incomplete" not in report
    left = sorted(p.name for p in root.iterdir())
    assert left == ["out", "report.json", "run.h5.done"], f"left behind: {left}"


def run_trials(mode_of, job, reference, tmp_path, label):
    rng = random.Random(f"{SEED}-{label}")
    random.seed(f"{SEED}-{label}-targets")
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    # The uninterrupted attempt's length sets the range of the delays (a little past its end, so that some
    # signals arrive while it exits or after it finished).
    probe = tmp_path / "probe"
    probe.mkdir()
    mode = mode_of(job, probe)
    started = time.monotonic()
    rc, stderr, _ = attempt(mode, 0, None, env)
    length = time.monotonic() - started
    assert rc == 0, stderr
    check_finished(probe, reference)
    codes = {}
    for trial in range(TRIALS):
        root = tmp_path / f"trial{trial}"
        root.mkdir()
        mode = mode_of(job, root)
        history = []
        for number in range(MAX_ATTEMPTS + 1):
            last = number == MAX_ATTEMPTS or rng.random() < 0.2
            interruption = None if last else rng.choice(mode.interruptions)
            delay = rng.uniform(0.0, 1.1 * length)
            rc, stderr, sent = attempt(mode, delay, interruption, env)
            history.append(f"attempt {number}: {sent or 'not interrupted'} -> exit {rc}")
            context = f"seed {SEED}, mode {mode.name}, trial {trial}:\n" + "\n".join(history) + \
                f"\nstderr of the last attempt:\n{stderr[-4000:]}"
            allowed = {0} if sent is None else interruption[2]
            assert rc in allowed, f"exit {rc} not in {sorted(allowed)}; {context}"
            try:
                check_outputs_whole(root, reference)
            except AssertionError as e:
                raise AssertionError(f"{e}; {context}") from None
            key = sent.split(" at ")[0] if sent else "none"
            codes.setdefault(key, {}).setdefault(rc, 0)
            codes[key][rc] += 1
            if rc == 0 and (root / "run.h5.done").exists():
                break
        try:
            check_finished(root, reference)
        except AssertionError as e:
            raise AssertionError(f"{e}; {context}") from None
        shutil.rmtree(root)
    print(f"\nsoak {label}: seed {SEED}, {TRIALS} trials, uninterrupted attempt {length:.2f} s; exit codes "
          f"by interruption: {json.dumps(codes, sort_keys=True)}")


def test_random_interruptions_of_one_process(job, reference, tmp_path):
    run_trials(single_mode, job, reference, tmp_path, "single")


def test_random_interruptions_of_three_ranks(job, reference, tmp_path):
    if not DIST or shutil.which(MPIEXEC) is None:
        pytest.skip("symprune_dist or mpirun not available")
    run_trials(mpi_mode, job, reference, tmp_path, "mpi3")
