"""Failures in symprune_dist end every rank promptly with the failing rank's message, never a hang in a
collective, and leave nothing at --out (issue 9)."""
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import DIST, MPIEXEC, mpirun
from prune_support import head_overflowing_model, sharded_stories, symprune

RUN = ["--method", "wanda", "--sparsity", "0.5", "--nsamples", "16", "--seqlen", "64", "--micro-batch", "3",
       "--threads", "1"]


def listing(path):
    return sorted(p.name for p in path.iterdir())


def test_bad_options_are_refused_on_every_rank_with_prunes_message(stories, tmp_path, have_mpirun):
    args = ["--model", stories.model, "--calib", stories.first, *RUN, "--sparsity", "1.5", "--out", tmp_path / "o"]
    args.remove("0.5")
    args.remove("--sparsity")
    single = symprune("prune", *args, check=False)
    start = time.time()
    proc = mpirun(3, *args, timeout=60)
    assert proc.returncode == 1
    message = single.stderr.strip().splitlines()[-1].removeprefix("symprune: ")
    assert message in proc.stderr  # the same message symprune prune gives
    assert proc.stderr.count(message) == 1  # said once (rank 0), not three times
    assert time.time() - start < 30 and listing(tmp_path) == []


def test_a_misspelled_option_is_named_once_with_the_nearest_known_one(stories, tmp_path, have_mpirun):
    proc = mpirun(2, "--modle", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o", timeout=60)
    assert proc.returncode == 1
    message = "symprune_dist: unknown option --modle (did you mean --model?)"
    assert proc.stderr.count(message) == 1, proc.stderr
    assert listing(tmp_path) == []


def test_a_missing_calibration_file_is_a_clean_error(stories, tmp_path, have_mpirun):
    proc = mpirun(2, "--model", stories.model, "--calib", tmp_path / "nope.txt", *RUN, "--out", tmp_path / "o",
                  timeout=60)
    assert proc.returncode == 1 and "nope.txt" in proc.stderr
    assert listing(tmp_path) == []


@pytest.mark.parametrize("failing_rank", [0, 2])
def test_an_error_on_one_rank_ends_every_rank_within_seconds(stories, tmp_path, have_mpirun, failing_rank):
    start = time.time()
    proc = mpirun(3, "--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o",
                  env={"SYMPRUNE_FAULT": f"block:2@{failing_rank}:error"}, timeout=60)
    elapsed = time.time() - start
    assert proc.returncode != 0
    assert f"[rank {failing_rank}/3] error: injected fault at block:2" in proc.stderr
    assert elapsed < 30, f"took {elapsed:.0f} s"
    assert not (tmp_path / "o").exists()


def test_nan_weights_name_the_tensor_and_stop_all_ranks(stories, tmp_path, have_mpirun):
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    tensors = load_file(str(model / "model.safetensors"))
    w = tensors["model.layers.1.mlp.up_proj.weight"].copy()
    w[100, 7] = np.nan  # in rows owned by rank 1 of 2
    tensors["model.layers.1.mlp.up_proj.weight"] = w
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    start = time.time()
    proc = mpirun(2, "--model", model, "--calib", stories.first, *RUN, "--out", tmp_path / "o", timeout=60)
    # One agreed error, said once by rank 0 (each rank used to throw it alone inside scoring and end the
    # job through MPI_Abort, every rank printing it).
    assert proc.returncode == 1, proc.stderr
    assert "error: 1.mlp.up_proj: weight [100, 7] is nan (NaN/Inf weights cannot be scored)" in proc.stderr
    assert proc.stderr.count("symprune_dist: error: ") == 1 and "MPI_ABORT" not in proc.stderr, proc.stderr
    assert time.time() - start < 30 and not (tmp_path / "o").exists()


def test_non_finite_activations_are_one_agreed_error(stories, tmp_path, have_mpirun):
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    tensors = load_file(str(model / "model.safetensors"))
    # Finite but huge: every rank's windows overflow in the attention, so the reduced statistics of o_proj's
    # input are not finite on every rank.
    tensors["model.layers.0.self_attn.v_proj.weight"] = np.full_like(
        tensors["model.layers.0.self_attn.v_proj.weight"], 3e38)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    proc = mpirun(2, "--model", model, "--calib", stories.first, *RUN, "--out", tmp_path / "o", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "non-finite activations (NaN or Inf) reach the input of 0.self_attn.o_proj" in proc.stderr
    assert proc.stderr.count("symprune_dist: error: ") == 1 and "MPI_ABORT" not in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("group", ["row", "layer"])
def test_a_saturated_score_in_one_ranks_rows_is_one_agreed_error(stories, tmp_path, have_mpirun, group):
    """Weights of 1e20 in rank 1's rows of one matrix: only rank 1's symmetric scores leave fp32's range. Every
    rank agrees before selecting (with --group layer, rank 0 would otherwise wait in the selection's
    all-reduce)."""
    model = tmp_path / "model"
    shutil.copytree(stories.model, model)
    tensors = load_file(str(model / "model.safetensors"))
    w = tensors["model.layers.2.self_attn.q_proj.weight"].copy()
    w[40:] *= 1e20  # rows 32.. are rank 1's of 2
    tensors["model.layers.2.self_attn.q_proj.weight"] = w
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    proc = mpirun(2, "--model", model, "--method", "symmetric", "--sparsity", "0.5", "--group", group,
                  "--threads", "1", "--out", tmp_path / "o", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "error: 2.self_attn.q_proj: the symmetric score of weight [40, " in proc.stderr, proc.stderr
    assert proc.stderr.count("symprune_dist: error: ") == 1 and "MPI_ABORT" not in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_non_finite_evaluation_is_one_agreed_error_and_removes_the_written_model(stories, tmp_path,
                                                                                     have_mpirun):
    model = head_overflowing_model(stories.model, tmp_path / "model")  # every rank's chunks overflow
    # 200 chunks of 64 tokens: more than one evaluation batch (128), so both ranks score chunks and fail.
    args = ["--model", model, "--calib", stories.first, *RUN, "--eval", stories.second, "--eval-seqlen", "64",
            "--eval-max-chunks", "200", "--out", tmp_path / "o", "--report", tmp_path / "r.json"]
    single = symprune("prune", *args, check=False)
    assert single.returncode == 1 and not (tmp_path / "o").exists(), single.stderr
    message = single.stderr.strip().splitlines()[-1].removeprefix("symprune: ")
    assert "has a non-finite loss" in message and "its pruned model" in message and "was removed" in message
    proc = mpirun(2, *args, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("symprune_dist: error: ") == 1 and message in proc.stderr, proc.stderr
    assert "MPI_ABORT" not in proc.stderr and "/2] error" not in proc.stderr, proc.stderr
    assert listing(tmp_path) == ["model"]


def test_an_evaluation_error_on_a_rank_other_than_0_removes_the_written_model(stories, tmp_path, have_mpirun):
    """Rank 1's chunks fail after the model is written: every rank agrees on the error, and rank 0, which
    wrote the model's directory, removes it (the fault point used to lie outside the agreement: rank 1 ended
    alone with MPI_Abort and the model stayed)."""
    args = ["--model", stories.model, "--calib", stories.first, *RUN, "--eval", stories.second, "--eval-seqlen",
            "64", "--eval-max-chunks", "200", "--out", tmp_path / "o", "--report", tmp_path / "r.json"]
    proc = mpirun(2, *args, env={"SYMPRUNE_FAULT": "pruned_eval@1:error"}, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("symprune_dist: error: ") == 1, proc.stderr
    assert "injected fault at pruned_eval" in proc.stderr and "was removed" in proc.stderr, proc.stderr
    assert "MPI_ABORT" not in proc.stderr, proc.stderr
    assert listing(tmp_path) == []


def test_memory_exhausted_up_front_is_refused_by_all_ranks(stories, tmp_path, have_mpirun):
    proc = mpirun(2, "--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o",
                  env={"SYMPRUNE_MEMORY_AVAILABLE": "1000"}, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("of host memory (") == 1, proc.stderr
    assert "; 2 ranks of this node share its memory): lower" in proc.stderr, proc.stderr
    assert listing(tmp_path) == []


def test_a_full_disk_on_one_writer_fails_all_ranks_cleanly(tmp_path, have_mpirun):
    """Shards are written by different ranks; a write error on any of them fails every rank with its message
    and no staging directory is left."""
    args = ["--model", "synthetic:tiny-llama:1:layers=2", "--calib", "synthetic", *RUN, "--out", tmp_path / "o"]
    proc = mpirun(2, *args, env={}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o" / "model.safetensors").exists()
    # An output directory on a tiny tmpfs: writing fails with "No space left on device".
    point = tmp_path / "small"
    point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", point], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        proc = mpirun(2, *args[:-1], point / "o", timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert "No space left on device" in proc.stderr
        assert listing(point) == []
    finally:
        subprocess.run(["umount", point], check=True)


def test_an_output_another_writer_rank_cannot_write_fails_before_any_work(stories, tmp_path, have_mpirun):
    """Rank 1 writes the second of two shards, and its mount of --out's parent is read-only (a private bind
    mount, as on a node that mounts the file system read-only). Before, every block ran and the run failed
    when rank 1 wrote its shard; now every rank stops before the first block, with rank 1's reason."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private read-only mount for one rank needs root and unshare")
    model, _ = sharded_stories(stories, tmp_path, 2)
    parent = tmp_path / "outputs"
    parent.mkdir()
    wrapper = tmp_path / "rank1_read_only.sh"
    wrapper.write_text("#!/bin/bash\n"
                       'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then\n'
                       "  exec unshare -m bash -c 'mount --bind -o ro \"$0\" \"$0\" && exec \"$@\"' "
                       f'{parent} {DIST} "$@"\n'
                       "fi\n"
                       f'exec {DIST} "$@"\n')
    wrapper.chmod(0o755)
    args = ["--model", model, "--calib", stories.first, *RUN, "--out", parent / "out"]
    if mpirun(2, *args[:-1], tmp_path / "out", binary=wrapper, timeout=120).returncode != 0:
        pytest.skip("no private read-only mount here")  # the same run, rank 1 writing elsewhere, must work
    proc = mpirun(2, *args, binary=wrapper, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"--out {parent / 'out'}: cannot write in {parent}: Read-only file system" in proc.stderr, proc.stderr
    assert "block 1/" not in proc.stderr and listing(parent) == []


def test_sigterm_while_the_output_is_written_stops_every_rank_without_output(stories, tmp_path, have_mpirun):
    """With several ranks only agreed stops count: a SIGTERM to the ranks while they write the shards must
    stop them before the output is installed, as it stops one process (it used to be ignored: exit 0)."""
    command = [MPIEXEC, "-n", "2", "--oversubscribe", "--allow-run-as-root", DIST,
               *map(str, ["--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o"])]
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1", "SYMPRUNE_FAULT": "shards_written:busy=3"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while not any(p.name.startswith(".o.tmp-") for p in tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.05)
    ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(int(pid), signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0, stderr
    assert "interrupted by SIGTERM" in stderr, stderr
    assert listing(tmp_path) == [], listing(tmp_path)


@pytest.mark.parametrize("rank,options,differing", [
    (1, {"--sparsity": "0.7"}, "config.sparsity: rank 0 has 0.5, rank 1 has 0.7"),
    (1, {"--checkpoint": "CKPT"}, "config.checkpoint: rank 0 has null, rank 1 has"),
    (1, {"--report": "REPORT"}, "config.report: rank 0 has null, rank 1 has"),  # was ignored without a word
    (1, {"--calib": "SECOND"}, "calibration: rank 0 has"),
    (1, {"--sparsity": "half"}, "[rank 1/2] the ranks got different command lines: this rank's ends the run, and "
                                "not as that of rank 0 does"),
    # Rank 0's own command line is the one refused: it names the other rank, then its error.
    (0, {"--bogus": None}, "[rank 0/2] the ranks got different command lines: this rank's ends the run, and not "
                           "as that of rank 1 does (every rank must get the same options):\n"
                           "symprune_dist: unknown option --bogus ('symprune_dist --help' lists the options)"),
])
def test_ranks_started_with_other_options_or_data_are_refused(stories, tmp_path, have_mpirun, rank, options,
                                                             differing):
    """An MPMD launch (or per-node files) giving ranks other options or data must not mix rows silently
    (other sparsity, calibration) or hang (a checkpoint on one rank only, a command line only one rank
    refuses). `options` are set on `rank`'s command line (None: a flag added)."""
    base = ["--model", stories.model, *RUN, "--calib", stories.first, "--out", tmp_path / "o"]
    lines = [list(base), list(base)]
    line = lines[rank]
    for option, value in options.items():
        value = {"CKPT": tmp_path / "c.h5", "SECOND": stories.second, "REPORT": tmp_path / "r.json"}.get(value, value)
        if value is None:
            line.append(option)
        elif option in line:
            line[line.index(option) + 1] = value
        else:
            line += [option, value]
    first, second = lines
    command = [MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-n", "1", DIST, *map(str, first), ":",
               "-n", "1", DIST, *map(str, second)]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    assert proc.returncode == 1, proc.stderr
    assert differing in proc.stderr, proc.stderr
    assert time.time() - start < 60
    assert listing(tmp_path) == [], listing(tmp_path)


def test_ranks_with_and_without_resume_are_refused_by_the_identity_check(stories, tmp_path, have_mpirun):
    """Whether the run had finished is asked on every rank before the ranks compare their options: asked only
    where --resume was given, it met the other ranks' comparison (a hang or MPI_ERR_TRUNCATE)."""
    base = ["--model", stories.model, *RUN, "--calib", stories.first, "--out", tmp_path / "o", "--checkpoint",
            tmp_path / "c.h5"]
    command = [MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-n", "1", DIST, *map(str, base), ":", "-n", "1",
               DIST, *map(str, base), "--resume", "auto"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "config.resume: rank 0 has null, rank 1 has \"auto\"" in proc.stderr, proc.stderr
    assert "MPI_ERR" not in proc.stderr


def test_comm_nccl_on_cpus_is_a_clear_error(stories, tmp_path, have_mpirun):
    proc = mpirun(2, "--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o",
                  "--device", "cpu", "--comm", "nccl", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "--comm nccl all-reduces GPU memory, one GPU per node-local rank, but this run is on the cpu" in proc.stderr
    assert proc.stderr.count("--comm nccl all-reduces") == 1 and listing(tmp_path) == []


@pytest.mark.parametrize("extra,message", [
    (["--threads", "100000"], "--threads 100000: use 0 (automatic: one per CPU) or 1.."),
    (["--resume", "NODIR/x.h5"], "--resume NODIR/x.h5: no such checkpoint"),
])
def test_errors_every_rank_finds_end_them_with_one_message_not_an_abort(stories, tmp_path, have_mpirun, extra,
                                                                        message):
    extra = [str(tmp_path / "nodir" / "x.h5") if a == "NODIR/x.h5" else a for a in extra]
    message = message.replace("NODIR", str(tmp_path / "nodir"))
    args = ["--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o"]
    args = [a for a in args if a not in ("--threads", "1")] + extra
    proc = mpirun(3, *args, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count(message) == 1 and "MPI_ABORT" not in proc.stderr, proc.stderr
    assert listing(tmp_path) == []


def test_one_rank_ends_an_error_like_symprune_not_with_an_abort(stories, tmp_path, have_mpirun):
    report = tmp_path / "nodir" / "r.json"
    proc = mpirun(1, "--model", stories.model, "--calib", stories.first, *RUN, "--out", tmp_path / "o", "--report",
                  report, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "symprune_dist: error: " in proc.stderr
    assert f"{report}: directory {tmp_path / 'nodir'} does not exist" in proc.stderr
    assert "MPI_ABORT" not in proc.stderr and "[rank 0/1]" not in proc.stderr, proc.stderr
    assert listing(tmp_path) == []
