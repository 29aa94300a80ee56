#!/usr/bin/env python3
"""The host memory plan against the memory runs use: bench/results/host_memory_plan.{json,md}.

Each case is a CPU `symprune prune` of a synthetic model with a --report. Its `host_memory` gives the plan
(`planned`, by term), the resident size when the plan was checked (`resident_at_plan`: libraries, the
globals and what was read before) and the peak resident size (`peak_resident`, VmHWM). What the run used
after the check is `grown` = peak - resident_at_plan + globals (the plan counts the globals, loaded before
it); the plan should bound it (grown / planned <= 1) without being far above it.

With --baseline BIN, the same cases also run on another build (one without the plan, say), and the table
gives both peak resident sizes (GNU time's maximum RSS), measured in the same session.

Usage: python3 bench/host_memory_plan.py [--build build] [--baseline BIN] [--quick] [--name host_memory_plan]"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SYMPRUNE_DATA", ROOT.parent / "shared" / "data"))
EVAL = ["--eval", str(DATA / "wikitext2" / "wiki.test.hf_rows_joined_nn.txt"), "--tokenizer",
        str(DATA / "llama2c_tokenizer" / "tokenizer.model")]
SMALL = "synthetic:llama-1024:layers=2"
CALIB = ["--calib", "synthetic", "--sparsity", "0.5"]
MIB = 1 << 20

# (name, model, options); --quick runs the ones marked quick.
CASES = [
    ("1024 wanda 16x1024", SMALL, ["--method", "wanda", "--nsamples", "16", "--seqlen", "1024"], True),
    ("1024 wanda 64x1024 mb4", SMALL, ["--method", "wanda", "--nsamples", "64", "--seqlen", "1024",
                                       "--micro-batch", "4"], True),
    ("1024 wanda 16x1024 mb1", SMALL, ["--method", "wanda", "--nsamples", "16", "--seqlen", "1024",
                                       "--micro-batch", "1"], True),
    ("1024 magnitude", SMALL, ["--method", "magnitude"], True),
    ("1024 ria recon", SMALL, ["--method", "ria", "--refine", "recon", "--nsamples", "16", "--seqlen", "1024"],
     True),
    ("1024 wanda r2dsnot checkpoint", SMALL, ["--method", "wanda", "--refine", "r2dsnot", "--nsamples", "16",
                                              "--seqlen", "1024", "--checkpoint", "CHECKPOINT"], True),
    ("1024 wanda recon-tokens 0", SMALL, ["--method", "wanda", "--nsamples", "16", "--seqlen", "1024",
                                          "--recon-tokens", "0"], True),
    ("1024 wanda eval 32 chunks", SMALL, ["--method", "wanda", "--nsamples", "16", "--seqlen", "1024", *EVAL,
                                          "--eval-max-chunks", "32"], True),
    ("opt-1.3b wanda 16x1024", "synthetic:opt-1.3b:layers=2", ["--method", "wanda", "--nsamples", "16",
                                                               "--seqlen", "1024"], False),
    ("llama3-8b wanda 8x1024", "synthetic:llama3-8b:layers=1", ["--method", "wanda", "--nsamples", "8",
                                                                "--seqlen", "1024"], False),
    ("7b wanda 8x2048 mb1", "synthetic:llama2-7b:layers=1", ["--method", "wanda", "--nsamples", "8",
                                                             "--seqlen", "2048", "--micro-batch", "1"], False),
    ("7b wanda 16x2048 (2 blocks)", "synthetic:llama2-7b:layers=2", ["--method", "wanda", "--nsamples", "16",
                                                                     "--seqlen", "2048"], False),
]


def run(binary, model, options, workdir, report):
    """Runs one prune under GNU time; returns (seconds, max RSS bytes, the report's host_memory or None)."""
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    options = [str(workdir / "ck.h5") if o == "CHECKPOINT" else o for o in options]
    timefile = workdir / "time.txt"
    cmd = ["/usr/bin/time", "-f", "%M", "-o", str(timefile), str(binary), "prune", "--model", model, *CALIB,
           *options, "--threads", "2", "--out", str(out)]
    if report:
        cmd += ["--report", str(workdir / "r.json")]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rss = int(timefile.read_text().split()[-1]) * 1024
    memory = json.loads((workdir / "r.json").read_text())["host_memory"] if report else None
    for leftover in workdir.glob("ck.h5*"):
        leftover.unlink()
    shutil.rmtree(out, ignore_errors=True)
    return seconds, rss, memory


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--baseline", help="another symprune binary to measure the same cases with")
    parser.add_argument("--quick", action="store_true", help="the 1024-wide cases only")
    parser.add_argument("--name", default="host_memory_plan", help="bench/results/NAME.{json,md}")
    args = parser.parse_args()
    binary = Path(args.build) / "apps" / "symprune"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    # The binary's commit is the one it was configured at; the source's is what it was built from.
    source = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    baseline_version = (subprocess.run([args.baseline, "--version"], capture_output=True, text=True)
                        .stdout.strip() if args.baseline else None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="host_memory_plan_") as tmp:
        workdir = Path(tmp)
        for name, model, options, quick in CASES:
            if args.quick and not quick:
                continue
            seconds, rss, memory = run(binary, model, options, workdir, True)
            plan = memory["plan"]
            grown = memory["peak_resident"] - memory["resident_at_plan"] + plan["globals"]
            row = {"case": name, "model": model, "options": options, "seconds": round(seconds, 1),
                   "planned": memory["planned"], "grown": grown, "ratio": round(grown / memory["planned"], 3),
                   "peak_resident": memory["peak_resident"], "max_rss": rss,
                   "resident_at_plan": memory["resident_at_plan"], "plan": plan}
            if args.baseline:
                _, row["baseline_max_rss"], _ = run(args.baseline, model, options, workdir, False)
            rows.append(row)
            print(f"{name:34s} planned {row['planned'] / MIB:8.0f} MiB  grown {grown / MIB:8.0f} MiB  "
                  f"ratio {row['ratio']:.3f}  max RSS {rss / MIB:.0f} MiB"
                  + (f" (baseline {row['baseline_max_rss'] / MIB:.0f} MiB)" if args.baseline else ""),
                  flush=True)
    result = {"symprune": version, "source": source, "baseline": baseline_version, "host": platform.node(),
              "cpus": os.cpu_count(), "threads": 2, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "cases": rows}
    results = ROOT / "bench" / "results"
    (results / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Host memory plan against measured memory (CPU)",
        "",
        f"`{version}` built from `{source}`, {os.cpu_count()} CPUs, `--threads 2`, {result['created']}. Written by "
        "`bench/host_memory_plan.py`. *grown* is what the run held beyond its resident size when the plan "
        "was checked (peak resident − resident at the check + the globals, which were loaded before it and "
        "which the plan counts); the plan is meant to bound it. Sizes in MiB.",
        "",
    ]
    header = "| case | planned | grown | grown / planned | peak RSS | largest terms |"
    rule = "|---|---:|---:|---:|---:|---|"
    if args.baseline:
        lines.insert(3, f"Baseline: `{baseline_version}` (the same cases, its peak RSS in the last column).")
        header += " baseline peak RSS |"
        rule += "---:|"
    lines += [header, rule]
    for row in rows:
        terms = sorted(row["plan"].items(), key=lambda kv: -kv[1])[:3]
        cells = [row["case"], f"{row['planned'] / MIB:.0f}", f"{row['grown'] / MIB:.0f}", f"{row['ratio']:.2f}",
                 f"{row['max_rss'] / MIB:.0f}", ", ".join(f"{k} {v / MIB:.0f}" for k, v in terms)]
        if args.baseline:
            cells.append(f"{row['baseline_max_rss'] / MIB:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    (results / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
