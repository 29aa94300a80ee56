"""The batch scripts of slurm/ on a real one-node Slurm cluster (munged, slurmctld, slurmd started by
slurm_cluster.py), with CPU ranks (--gpus-per-node=0) on stories260K:
- prune_node.sbatch (srun), prune_mpirun.sbatch and prune_multinode.sbatch (on one node) give outputs
  byte-identical to `symprune prune`;
- a job sent SIGUSR1 mid-run (`scancel --signal=USR1 --batch`; srun and mpirun pass it to the ranks) saves
  a checkpoint, requeues itself and resumes to the same bytes; requeued again after it finished, it does
  not rerun;
- a 2 methods x 2 sparsities array (submit_sweep.sh) and its collector give a four-row table with the
  perplexities of single runs.
Skipped with the reason where the cluster cannot start (not root, packages missing)."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from prune_support import SOURCE, Stories, output_digest, stories_job, uninterrupted_run  # noqa: E402
from slurm_cluster import ClusterUnavailable, LocalSlurmCluster  # noqa: E402

DIST = os.environ["SYMPRUNE_DIST_BIN"]
# Two CPU ranks of one thread per job; the scripts' GPU request is lifted on the command line.
CPU_RANKS = ["--gpus-per-node=0", "--ntasks-per-node=2", "--cpus-per-task=1"]
RUN = ["--nsamples", "8", "--seqlen", "64", "--micro-batch", "2", "--eval-seqlen", "64", "--eval-max-chunks",
       "12"]


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    return Stories(tmp_path_factory.mktemp("stories"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The cluster's directory must be short and private: munge and slurm check its permissions.
    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
    except ClusterUnavailable as why:
        pytest.skip(f"no Slurm cluster on this machine: {why}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def job_env():
    return {"SYMPRUNE_HOME": str(SOURCE), "SYMPRUNE_DIST": DIST}


def common(stories):
    return stories_job(stories, *RUN)


def reference(stories, root, *method):
    """`symprune prune` of the same job: (output digest, report)."""
    return uninterrupted_run([*common(stories), *method], root)


def submit(cluster, script, workdir, env, *args, resources=()):
    workdir.mkdir(parents=True, exist_ok=True)
    job = cluster.sbatch(*CPU_RANKS, *resources, SOURCE / "slurm" / script, *args, cwd=workdir, env=env)
    return job, workdir / f"{job_name(script)}-{job}.log"


def job_name(script):
    text = (SOURCE / "slurm" / script).read_text()
    return re.search(r"^#SBATCH --job-name=(\S+)", text, re.M).group(1)


def wait_for_text(path, pattern, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and re.search(pattern, path.read_text()):
            return
        time.sleep(0.2)
    raise AssertionError(f"'{pattern}' did not appear in {path} within {timeout} s:\n"
                         + (path.read_text() if path.exists() else "(no log)"))


def release_requeued(cluster, job, timeout=60):
    """Slurm holds a requeued batch job for about two minutes (BeginTime) before it may start again;
    the test lets it start as soon as the node has cleaned up the previous start (idle, no step daemon of
    the job left), as the two minutes would. The script and the resume are the same either way."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        record = cluster.job(job)[0]
        if (record["JobState"] == "PENDING" and int(record.get("Restarts", 0)) > 0
                and cluster.node_state().startswith("IDLE") and not cluster.steps_alive(job)):
            # slurmd refuses a job id whose credential it revoked in the same second ("Job N already
            # killed, do not launch batch job"): let a few seconds pass, as the hold would.
            time.sleep(3)
            cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job} was not requeued: {cluster.job(job)}")


METHOD = ["--method", "wanda", "--sparsity", "0.5"]


@pytest.fixture(scope="module")
def wanda50(stories, tmp_path_factory):
    return reference(stories, tmp_path_factory.mktemp("reference"), *METHOD)


# The multi-node script runs here on the one node there is (--nodes=1): its launch, not the network.
@pytest.mark.parametrize("script,resources", [("prune_node.sbatch", []), ("prune_mpirun.sbatch", []),
                                              ("prune_multinode.sbatch", ["--nodes=1"])])
def test_job_output_equals_symprune_prune(cluster, stories, job_env, wanda50, tmp_path, script, resources):
    expected_digest, expected = wanda50
    out = tmp_path / "job" / "out"
    job, log = submit(cluster, script, tmp_path / "job", job_env, *common(stories), *METHOD, "--out", out,
                      resources=resources)
    record = cluster.wait(job, timeout=240)[0]
    text = log.read_text()
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", text + cluster.log_tail("slurmd")
    assert "2 ranks over mpi" in text and f"done: output {out}" in text
    assert output_digest(out) == expected_digest
    report = json.loads(Path(f"{out}.report.json").read_text())
    assert report["perplexity"] == expected["perplexity"]
    assert Path(f"{out}.checkpoint.h5.done").exists()  # the checkpoint default: beside the output


@pytest.mark.parametrize("script", ["prune_node.sbatch", "prune_mpirun.sbatch"])
def test_signalled_job_requeues_resumes_and_does_not_rerun(cluster, stories, job_env, wanda50, tmp_path, script):
    expected_digest, expected = wanda50
    out = tmp_path / "job" / "out"
    # Block 3 takes 3 s more, so the signal lands mid-run, after blocks 1..2 were saved. Rank 1 leaves 5 s
    # after rank 0 (both exit 75; MPI_Finalize holds them together until then, a GPU context's teardown
    # does not): srun --kill-on-bad-exit (and mpirun) end it with SIGTERM, a second signal, which after a
    # saved stop must exit 75 too (it gave 143, which the script took for a failure).
    env = {**job_env, "SYMPRUNE_FAULT": "block:3:busy=3,after_finalize@1:busy=5"}
    job, log = submit(cluster, script, tmp_path / "job", env, *common(stories), *METHOD, "--out", out)
    wait_for_text(log, r"blocks 1\.\.2 of 5 saved")
    cluster.run("scancel", "--signal=USR1", "--batch", job)
    wait_for_text(log, r"requeueing job")
    release_requeued(cluster, job)
    record = cluster.wait(job, timeout=240)[0]
    text = log.read_text()  # --open-mode=append: both starts are in one log
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", text + cluster.log_tail("slurmd")
    saved = re.search(r"interrupted by SIGUSR1: blocks 1\.\.(\d) of 5 are saved", text)
    assert saved, text
    assert "after the warning: taken as the stop" not in text, text  # the step itself exited 75
    assert "start 2 (requeued 1 times)" in text
    assert f"resuming from checkpoint {out}.checkpoint.h5: blocks 1..{saved.group(1)} of 5 were done" in text
    assert output_digest(out) == expected_digest
    report = json.loads(Path(f"{out}.report.json").read_text())
    assert report["perplexity"] == expected["perplexity"]
    assert report["resumed"]["block"] == int(saved.group(1))

    # Requeued once more after it finished (e.g. a node failure): the run is not redone.
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    cluster.run("scontrol", "requeue", job)
    release_requeued(cluster, job)
    record = cluster.wait(job, timeout=120)[0]
    text = log.read_text()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "2", text + cluster.log_tail("slurmd")
    assert "start 3 (requeued 2 times)" in text and "already complete" in text
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


CELLS = {"wanda-50": ["--method", "wanda", "--sparsity", "0.5"],
         "wanda-60": ["--method", "wanda", "--sparsity", "0.6"],
         "ria-50": ["--method", "ria", "--sparsity", "0.5"],
         "ria-60": ["--method", "ria", "--sparsity", "0.6"]}


def test_sweep_array_and_collector_table(cluster, stories, job_env, tmp_path):
    grid = tmp_path / "grid.tsv"
    grid.write_text("# 2 methods x 2 sparsities\n\n"
                    + "".join(f"{name}  {' '.join(options)}\n" for name, options in CELLS.items()))
    sweep = tmp_path / "sweep"
    env = {**job_env, "SYMPRUNE_SBATCH_ARGS": "--gpus-per-node=0 --ntasks-per-node=1 --cpus-per-task=1"}
    proc = subprocess.run(["bash", SOURCE / "slurm" / "submit_sweep.sh", grid, sweep, *map(str, common(stories))],
                          capture_output=True, text=True, env={**cluster.env, **env}, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    jobs = re.search(r"array job (\d+), collector job (\d+)", proc.stdout)
    assert jobs, proc.stdout
    references = {name: reference(stories, tmp_path / "reference" / name, *options)[1]
                  for name, options in CELLS.items()}
    array = cluster.wait(jobs.group(1), timeout=400)
    assert [r["JobState"] for r in array] == ["COMPLETED"] * 4, \
        f"{array}\n" + "".join(p.read_text() for p in sorted(sweep.glob("*.log"))) + cluster.log_tail("slurmd")
    collector = cluster.wait(jobs.group(2), timeout=120)[0]
    assert collector["JobState"] == "COMPLETED", (sweep / f"collect-{jobs.group(2)}.log").read_text()

    table = json.loads((sweep / "results.json").read_text())
    assert [row["cell"] for row in table["rows"]] == list(CELLS)
    for row in table["rows"]:
        expected = references[row["cell"]]
        assert row["status"] == "done"
        assert row["method"] == expected["config"]["method"]
        assert row["sparsity"] == expected["sparsity"]["total"]
        assert row["perplexity_pruned"] == expected["perplexity"]["pruned"]
        assert row["perplexity_dense"] == expected["perplexity"]["dense"]
        assert row["seconds"] > 0
    markdown = (sweep / "results.md").read_text()
    for name in CELLS:
        line = next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))
        assert f"{references[name]['perplexity']['pruned']:.3f}" in line and line.endswith("| done |")
    assert "4 of 4 cells done" in markdown
