"""scripts/gpu_checks.sh, the recipe of the rare GPU session, run here on a fake bundle (shell scripts in place
of the CUDA build's binaries): the groups of steps run in the order asked and the steps of a group at the same
time, each stopped at its own limit, every step's results come back as the two files the device tool can
return, and a group that no longer fits before DEADLINE is named, not started."""
import time
import os
import subprocess
import tarfile
from pathlib import Path

from prune_support import SOURCE

SCRIPT = SOURCE / "scripts" / "gpu_checks.sh"

FAKE_SYMPRUNE = """#!/usr/bin/env bash
[[ $1 == info ]] && echo "CUDA devices: 1 (fake)"
exit 0
"""
# A gtest binary with one suite; each run takes FAKE_TEST_SECONDS and writes its XML report.
FAKE_GPU_TESTS = """#!/usr/bin/env bash
for arg in "$@"; do
  case "$arg" in
    --gtest_list_tests) printf 'FakeSuite.\\n  Passes\\n'; exit 0 ;;
    --gtest_output=xml:*) xml="${arg#--gtest_output=xml:}" ;;
  esac
done
sleep "${FAKE_TEST_SECONDS:-0}"
echo '<testsuites><testcase name="Passes" status="run" result="completed" classname="FakeSuite"/></testsuites>' >"$xml"
echo "[  PASSED  ] 1 test."
"""
FAKE_KERNELS_BENCH = """#!/usr/bin/env bash
sleep "${FAKE_BENCH_SECONDS:-0}"
while (($#)); do [[ $1 == --json ]] && echo '{"cases": []}' >"$2"; shift; done
echo "kernel bench done"
"""


def make_bundle(root):
    for name, text in (("symprune", FAKE_SYMPRUNE), ("symprune_gpu_tests", FAKE_GPU_TESTS),
                       ("cuda_kernels_bench", FAKE_KERNELS_BENCH)):
        path = root / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    (root / "lib").mkdir()
    (root / "commit").write_text("fake\n")
    return root


def run_checks(tmp_path, steps, deadline, test_seconds=0, bench_seconds=0):
    bundle = make_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEADLINE": str(deadline), "FAKE_TEST_SECONDS": str(test_seconds),
           "FAKE_BENCH_SECONDS": str(bench_seconds)}
    proc = subprocess.run(["bash", SCRIPT, bundle, "--steps", steps], capture_output=True, text=True, env=env,
                          timeout=300)
    return proc, out


def packed_names(out):
    with tarfile.open(out / "gpu-results.tar.gz") as tar:
        return {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}


def test_steps_run_in_the_order_given_and_come_back_as_two_files(tmp_path):
    proc, out = run_checks(tmp_path, "kernels_bench,tests", deadline=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu-results.tar.gz", "summary.txt"]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["kernels_bench", "gpu_tests"]
    assert all("rc=0" in line for line in summary), summary
    names = packed_names(out)
    assert {"environment.log", "kernels_bench.log", "gpu_tests.log", "cuda_kernels_bench.json",
            "gpu_tests/FakeSuite.xml", "summary.txt"} <= names, names


def test_a_step_that_no_longer_fits_before_the_deadline_is_named_not_started(tmp_path):
    # 75 s: the first step starts with 65 s left and takes 10; the second would start with under 60.
    proc, out = run_checks(tmp_path, "tests,kernels_bench", deadline=75, test_seconds=10)
    assert proc.returncode == 0, proc.stderr
    summary = (out / "summary.txt").read_text()
    assert summary.splitlines()[0].startswith("gpu_tests") and "rc=0" in summary.splitlines()[0]
    assert "not run (no time left before DEADLINE=75 s): kernels_bench" in summary
    assert "kernels_bench.log" not in packed_names(out)
    assert "not run" in proc.stdout  # the table is printed last, for the tool's output tail


def test_the_steps_of_a_group_run_together_each_stopped_at_its_own_limit(tmp_path):
    # tests (6 s) and kernels_bench (20 s, limit 3 s) together, then tests again: about 12 s, not 26 or more.
    start = time.monotonic()
    proc, out = run_checks(tmp_path, "tests:60+kernels_bench:3,tests", deadline=300, test_seconds=6,
                           bench_seconds=20)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["gpu_tests", "kernels_bench", "gpu_tests"], summary
    assert "rc=0" in summary[0] and "rc=0" in summary[2], summary
    assert "rc=124" in summary[1], summary
    assert elapsed < 20, elapsed
    seconds = [int(line.split()[-1].rstrip("s")) for line in summary]
    assert 5 <= seconds[0] <= 8 and 2 <= seconds[1] <= 5, summary  # each its own time, not the group's
    with tarfile.open(out / "gpu-results.tar.gz") as tar:
        log = tar.extractfile("gpu-results/kernels_bench.log").read().decode()
    assert "kernels_bench stopped after 3 s" in log


def test_a_group_that_no_longer_fits_is_named_whole(tmp_path):
    proc, out = run_checks(tmp_path, "tests,tests+kernels_bench:30", deadline=75, test_seconds=10)
    assert proc.returncode == 0, proc.stderr
    assert "not run (no time left before DEADLINE=75 s): tests+kernels_bench:30" in (out / "summary.txt").read_text()


def test_a_malformed_plan_is_refused_before_any_step(tmp_path):
    for plan, message in (("tests++memcheck", "groups separated by ','"), ("tests:ten", "groups separated by ','"),
                          ("tests+membrane", "unknown step 'membrane'")):
        proc, out = run_checks(tmp_path / plan.replace(":", "_"), plan, deadline=300)
        assert proc.returncode == 2 and message in proc.stderr, (plan, proc.stderr)
        assert not any(out.iterdir())
