"""The device pipeline over several MPI ranks (issue 10): symprune_dist with `--device cuda`, its kernels
run by the CPU emulation of CUDA (every rank sharing the one emulated device), gives the output of one
`symprune prune` process on the CPU byte for byte, for R that divides neither the calibration chunks nor
the rows; a device run killed after a block resumes on another number of ranks to the same output.

What this covers that the single-process device tests do not: block weights broadcast and then uploaded
on each rank, each rank's rows of a device weight, per-layer selection whose histograms are summed over
ranks from device scores, R²-DSnoT's column norms of the whole gathered mask, statistics and Gram
matrices from device passes reduced over MPI, and checkpoints written from and restored into device
memory by several ranks.
The emulation runs each CUDA thread as an OS thread, so the runs are small (4 windows of 8 tokens)."""
import json

import pytest

from conftest import DIST_EMULATED, mpirun
from prune_support import output_digest, symprune

CALIB = ["--nsamples", "4", "--seqlen", "8", "--micro-batch", "1", "--recon-tokens", "16", "--threads", "1"]

CASES = {
    # N:M scores and selection on the device; the recon refinement reads Gram matrices computed on the
    # device per chunk and summed over ranks in chunk order.
    "ria-2:4+recon": ["--method", "ria", "--nm", "2:4", "--refine", "recon"],
    # One threshold per layer: the key histograms of every rank's device scores summed over MPI.
    "symwanda-layer": ["--method", "symwanda", "--sparsity", "0.6", "--group", "layer"],
}


def swaps(report):
    """The refinement's swaps per linear (None where it did not refine)."""
    return [(l.get("refine") or {}).get("swaps") for l in report["layers"]]


def cpu_reference(stories, tmp_path, case_args, name):
    out = tmp_path / f"cpu-{name}"
    symprune("prune", "--model", stories.model, "--calib", stories.first, *CALIB, *case_args, "--device", "cpu",
             "--out", out, "--report", f"{out}.json")
    return output_digest(out), json.loads((tmp_path / f"cpu-{name}.json").read_text())


@pytest.fixture(autouse=True)
def have_emulated_dist():
    if not DIST_EMULATED:
        pytest.skip("SYMPRUNE_DIST_EMULATED_BIN is not set (ctest sets it)")


def device_run(stories, run_dir, ranks, case_args, extra=(), env=None, comm="mpi", calib=CALIB):
    args = ["--model", stories.model, "--calib", stories.first, *calib, *case_args, "--device", "cuda",
            "--comm", comm, "--out", run_dir / "out", "--report", run_dir / "report.json", *extra]
    return mpirun(ranks, *args, env=env, timeout=600, binary=DIST_EMULATED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_ranks_give_the_cpu_output(stories, tmp_path, have_mpirun, name):
    expected, reference = cpu_reference(stories, tmp_path, CASES[name], name)
    if "--refine" in CASES[name]:
        assert sum(filter(None, swaps(reference))) > 0  # the refinement changes masks here
    for ranks in (2, 3):
        run_dir = tmp_path / f"r{ranks}-{name}"
        run_dir.mkdir()
        proc = device_run(stories, run_dir, ranks, CASES[name])
        assert proc.returncode == 0, proc.stderr
        assert output_digest(run_dir / "out") == expected, f"R={ranks} on the device differs from the CPU"
        report = json.loads((run_dir / "report.json").read_text())
        assert report["config"]["device"] == "cuda" and report["config"]["ranks"] == ranks
        assert [l["pruned"] for l in report["layers"]] == [l["pruned"] for l in reference["layers"]]
        assert swaps(report) == swaps(reference)
        # The report's reconstruction errors come from device GEMMs: equal to the CPU's to 1e-4.
        for got, want in zip(report["layers"], reference["layers"]):
            assert want["recon_error"] is not None and got["recon_error"] is not None, got["name"]
            assert got["recon_error"] == pytest.approx(want["recon_error"], rel=1e-4, abs=1e-6), got["name"]


def test_killed_device_run_resumes_on_another_rank_count(stories, tmp_path, have_mpirun):
    # R²-DSnoT on each rank's device rows: its relative factor reads the column norms of the whole initial
    # mask, gathered over ranks; the guard reads Gram matrices. (N:M: per-row selection costs the
    # emulation about a minute per run.)
    case = ["--method", "wanda", "--nm", "2:4", "--refine", "r2dsnot", "--refine-guard"]
    expected, reference = cpu_reference(stories, tmp_path, case, "r2dsnot")
    assert sum(filter(None, swaps(reference))) > 0
    checkpoint = ["--checkpoint", tmp_path / "run.h5"]
    killed = device_run(stories, tmp_path, 2, case, checkpoint, env={"SYMPRUNE_FAULT": "block:3:abort"})
    assert killed.returncode != 0 and not (tmp_path / "out").exists()
    assert (tmp_path / "run.h5").exists()
    resumed = device_run(stories, tmp_path, 3, case, [*checkpoint, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint" in resumed.stderr
    assert output_digest(tmp_path / "out") == expected
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resumed"] is not None and report["config"]["device"] == "cuda"
    assert swaps(report)[-7:] == swaps(reference)[-7:]  # the last block, refined after the resume


def test_one_rank_on_a_device_takes_mpi(stories, tmp_path, have_mpirun):
    # One rank has nothing to carry: --comm auto makes no NCCL communicator (its buffers and setup would be
    # all it did; in a NCCL build the emulated device is no device NCCL could use).
    proc = device_run(stories, tmp_path, 1, ["--method", "magnitude", "--sparsity", "0.5"], comm="auto")
    assert proc.returncode == 0, proc.stderr
    assert "1 ranks over mpi" in proc.stderr and (tmp_path / "out").is_dir()


def test_ranks_sharing_a_device_do_not_take_nccl(stories, tmp_path, have_mpirun):
    # NCCL refuses two ranks of one communicator on one GPU: with two ranks on the one device, --comm auto
    # runs over MPI, and --comm nccl ends every rank with one message instead of hanging in NCCL's setup.
    case = ["--method", "magnitude", "--sparsity", "0.5"]
    auto = device_run(stories, tmp_path, 2, case, comm="auto")
    assert auto.returncode == 0, auto.stderr
    assert "2 ranks over mpi" in auto.stderr and (tmp_path / "out").is_dir()
    refused_dir = tmp_path / "refused"
    refused_dir.mkdir()
    refused = device_run(stories, refused_dir, 2, case, comm="nccl")
    assert refused.returncode == 1, refused.stderr
    message = ("--comm nccl needs a GPU of its own for every rank (NCCL refuses two ranks on one GPU), but rank 0 "
               "shares its node's GPUs among 2 ranks")
    if "this symprune_dist is built without NCCL" in refused.stderr:  # README command 2 alone: a CPU-only build
        message = "--comm nccl: this symprune_dist is built without NCCL (configure with -DSYMPRUNE_WITH_NCCL=ON)"
    assert refused.stderr.count(message) == 1, refused.stderr
    assert "MPI_Abort" not in refused.stderr and not (refused_dir / "out").exists()


def test_ranks_sharing_a_device_plan_with_their_share_of_its_memory(stories, tmp_path, have_mpirun):
    # This run plans about 160 MiB and 256 MiB of a device are kept free: the 600 MiB of the one emulated
    # device are enough for one rank, not for two ranks that share it (300 MiB each).
    case = ["--method", "magnitude", "--nm", "2:4"]
    env = {"SYMPRUNE_MEMORY_AVAILABLE": str(600 << 20)}
    alone = device_run(stories, tmp_path, 1, case, env=env)
    assert alone.returncode == 0, alone.stderr
    memory = json.loads((tmp_path / "report.json").read_text())["device_memory"]
    assert 0 < memory["peak_used"] <= memory["planned"] <= memory["available_at_start"] < memory["free_at_start"]
    shared_dir = tmp_path / "shared"
    shared_dir.mkdir()
    shared = device_run(stories, shared_dir, 2, case, env=env)
    assert shared.returncode == 1, shared.stderr
    assert shared.stderr.count("; 2 ranks of this node share the device): lower") == 1, shared.stderr
    assert "lower the ranks per node (or give each its own device), or --device cpu" in shared.stderr
    assert "MPI_Abort" not in shared.stderr and not (shared_dir / "out").exists()


def test_device_run_checks_the_host_memory_its_samples_take(stories, tmp_path, have_mpirun):
    # A device run keeps the reconstruction error's samples of every input group on the host: with
    # --recon-tokens 0, (32 gathered + 32 own rows) x 364 values x 4 bytes = 91 KiB, beside the mask bits (about
    # 30 KiB). 64 KiB of host memory refuses it before the device plan; without the error the same 64 KiB
    # reaches the device check, so the host check did not count the hidden states, which are on the device.
    env = {"SYMPRUNE_MEMORY_AVAILABLE": str(64 << 10)}
    at = CALIB.index("--recon-tokens")
    calib = [*CALIB[:at], *CALIB[at + 2:], "--recon-tokens", "0"]
    case = ["--method", "wanda", "--sparsity", "0.5"]
    samples = device_run(stories, tmp_path, 1, case, env=env, calib=calib)
    assert samples.returncode == 1, samples.stderr
    assert "of host memory (reconstruction samples 91.0 KiB, mask bits " in samples.stderr, samples.stderr
    assert "lower the tokens the reconstruction error reads (--recon-tokens 0 reads every one: give 1024, or " \
        "--no-recon-error; reconstruction samples 91.0 KiB)" in samples.stderr, samples.stderr
    assert not (tmp_path / "out").exists()
    no_error_dir = tmp_path / "no-error"
    no_error_dir.mkdir()
    device = device_run(stories, no_error_dir, 1, case, extra=["--no-recon-error"], env=env, calib=calib)
    assert device.returncode == 1, device.stderr
    assert "host memory" not in device.stderr and "of cuda memory" in device.stderr, device.stderr
    assert not (no_error_dir / "out").exists()
