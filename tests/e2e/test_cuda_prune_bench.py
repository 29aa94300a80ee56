"""bench/cuda_prune_bench.py, the end-to-end benchmark of the rare GPU session, run here on the CPU at a toy
size (both tools on the CPU, one block of the 1024-wide synthetic LLaMA): its JSON has the issue's form,
with the device memory of symprune's report per case, and a failing case is recorded with its error while
the others still run and are written (the step may also be stopped at its limit: the files are rewritten
after every case)."""
import json
import subprocess
import sys

import pytest

from prune_support import BIN, SOURCE

BENCH = SOURCE / "bench" / "cuda_prune_bench.py"
TOY = ["--model", "llama-1024", "--blocks", "2", "--nsamples", "2", "--seqlen", "32", "--symprune-args",
       "--device cpu", "--torch-args", "--device cpu --dtype fp32"]


def run_bench(tmp_path, symprune, cases):
    out = tmp_path / "result"
    proc = subprocess.run([sys.executable, BENCH, "--symprune", symprune, *TOY, "--cases", cases, "--out", out],
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


def test_the_json_has_the_issues_form_with_every_case_scaled(tmp_path):
    proc, result, table = run_bench(tmp_path, BIN, "wanda-50,wanda-2:4")
    assert proc.returncode == 0, proc.stderr
    assert result["model"] == "synthetic:llama-1024" and (result["nsamples"], result["seqlen"]) == (2, 32)
    assert result["device"] and result["blocks_timed"] == 2
    assert result["scaled"] == "2 blocks timed, the other 2 counted at a typical timed block's times"
    assert [c["case"] for c in result["cases"]] == ["wanda-50", "wanda-2:4"]
    for case in result["cases"]:
        assert case["seconds"] > 0 and case["pytorch_seconds"] > 0 and case["floor_seconds"] > 0
        assert {"blocks", "scores_masks", "weights"} <= case["stages"].keys()
        # Two blocks timed, two more counted like block 1 (not block 0, which read its weights on the calling
        # thread); what ran once (calibration) counted once.
        first, second = case["block_timings"]
        assert (first["block"], second["block"], case["extrapolated_from_block"]) == (0, 1, 1)
        assert case["stages"]["blocks"] == pytest.approx(first["blocks"] + 3 * second["blocks"])
        assert case["stages"]["weights"] == pytest.approx(first["weights"] + 3 * second["weights"])
        assert case["seconds"] > first["seconds"] + 3 * second["seconds"]
        assert case["symprune_device"] == "cpu" and case["device_memory"] is None  # a GPU run's report has it
        # The issue's stages, the passes among them, each pass's rate from the model's FLOPs (4 blocks of
        # 2 x 32 tokens through 1024-wide linears: 4 * 64 * (2 * 12.6 M + 2 * 32 * 1024) FLOPs).
        stages = case["stages"]
        assert stages["dense_pass"] > 0 and stages["pruned_pass"] > 0
        assert stages["blocks"] == pytest.approx(stages["dense_pass"] + stages["pruned_pass"])
        pass_flops = 4 * 64 * (2 * (4 * 1024 * 1024 + 3 * 1024 * 2816) + 2 * 32 * 1024)
        assert case["pass_tflops"]["dense_pass"] == pytest.approx(pass_flops / stages["dense_pass"] / 1e12)
        assert case["pytorch_pass_tflops"]["pruned_pass"] == pytest.approx(
            pass_flops / case["pytorch_stages"]["pruned_pass"] / 1e12)
    assert "| wanda-2:4 |" in table
    assert "| case | weights | dense pass | statistics | scores and masks | refinement | pruned pass | other |" in table


def test_a_whole_model_run_is_reported_as_measured(tmp_path):
    out = tmp_path / "result"
    at = TOY.index("--blocks") + 1
    whole = [*TOY[:at], "4", *TOY[at + 1:]]  # every block of the 4-block model
    proc = subprocess.run([sys.executable, BENCH, "--symprune", BIN, *whole, "--cases", "wanda-50", "--no-torch",
                           "--out", out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["model"] == "synthetic:llama-1024" and result["scaled"] is None
    (case,) = result["cases"]
    assert case["extrapolated_from_block"] is None and len(case["block_timings"]) == 4
    assert case["stages"]["blocks"] == pytest.approx(sum(block["blocks"] for block in case["block_timings"]))
    assert "counted at" not in out.with_suffix(".md").read_text()


def test_a_failing_case_is_recorded_and_the_others_still_run(tmp_path):
    failing = tmp_path / "symprune"
    failing.write_text(f'#!/usr/bin/env bash\n[[ " $* " == *" ria "* ]] && {{ echo "no ria today" >&2; exit 9; }}\n'
                       f'exec {BIN} "$@"\n')
    failing.chmod(0o755)
    proc, result, table = run_bench(tmp_path, failing, "ria-50,wanda-50")
    assert proc.returncode != 0 and "cases that failed: ria-50" in proc.stderr
    ria, wanda = result["cases"]
    assert ria["case"] == "ria-50" and "no ria today" in ria["error"] and "(9)" in ria["error"]
    assert wanda["case"] == "wanda-50" and wanda["seconds"] > 0 and wanda["pytorch_seconds"] > 0
    assert "| ria-50 | failed" in table


def test_fewer_than_two_or_more_blocks_than_the_model_has_are_refused(tmp_path):
    for blocks in ("1", "5"):
        proc = subprocess.run([sys.executable, BENCH, "--symprune", BIN, "--model", "llama-1024", "--blocks", blocks,
                               "--out", tmp_path / "result"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--blocks must be between 2 and 4" in proc.stderr, proc.stderr
        assert not (tmp_path / "result.json").exists()
