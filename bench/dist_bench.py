#!/usr/bin/env python3
"""symprune_dist figures for issue 9, written to bench/results/dist_bench.{json,md}:

1. Scaling on CPU ranks: the same prune of a synthetic 1024-wide LLaMA (`synthetic:llama-1024`, 4 blocks,
   wanda 50 % and ria 50 % + r2dsnot) with 1 rank x 2 threads and 2 ranks x 1 thread on this machine:
   per-stage seconds from the report, and the bytes each rank sent and received per block by kind
   (statistics, Gram matrices, weights, masks). The outputs of the two runs are compared byte for byte.
2. Memory that does not grow with depth: peak RSS (GNU time, max over ranks) of the same shape with 8 and
   with 32 blocks, with --eval (the dense and pruned evaluations stream block by block), for 1 and 2 ranks.

Usage: python3 bench/dist_bench.py [--build build]."""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(cmd, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
    return proc


def timed(cmd, ranks, dist, env=None):
    """Runs under /usr/bin/time -v per rank; returns (seconds, peak RSS KiB over ranks, stderr)."""
    timer = ["/usr/bin/time", "-v"]
    if ranks == 1 and not dist:
        full = timer + cmd
    else:
        full = ["mpirun", "-n", str(ranks), "--allow-run-as-root", "--oversubscribe"] + timer + cmd
    start = time.time()
    proc = run(full, env=env)
    seconds = time.time() - start
    peaks = [int(m) for m in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)]
    return seconds, max(peaks), proc.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=str(ROOT / "build"))
    args = parser.parse_args()
    symprune = Path(args.build) / "apps" / "symprune"
    dist = Path(args.build) / "apps" / "symprune_dist"
    data = Path(os.environ.get("SYMPRUNE_DATA", ROOT.parent / "shared" / "data"))
    work = Path(tempfile.mkdtemp(prefix="dist_bench_"))
    results = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}, "scaling": [], "memory": []}
    try:
        # --- 1. scaling
        model = "synthetic:llama-1024:0"
        base = ["--model", model, "--calib", "synthetic", "--nsamples", "32", "--seqlen", "256", "--micro-batch", "4"]
        cases = {"wanda-50": ["--method", "wanda", "--sparsity", "0.5"],
                 "ria-50+r2dsnot": ["--method", "ria", "--sparsity", "0.5", "--refine", "r2dsnot"]}
        for name, case in cases.items():
            rows = {}
            for ranks, threads in ((1, 2), (2, 1)):
                out, report = work / f"{name}-r{ranks}", work / f"{name}-r{ranks}.json"
                binary = symprune if ranks == 1 else dist
                cmd = ([binary, "prune"] if ranks == 1 else [binary]) + base + case + [
                    "--threads", threads, "--out", out, "--report", report, "--log-level", "warn"]
                seconds, peak, _ = timed(cmd, ranks, dist=ranks > 1)
                r = json.loads(report.read_text())
                blocks = len(r["layers"]) // 7
                rows[ranks] = {"ranks": ranks, "threads_per_rank": threads, "wall_seconds": round(seconds, 2),
                               "stages": {k: round(v, 3) for k, v in r["timings"].items()},
                               "bytes_per_block_rank0": {k: v // blocks for k, v in r["communication_bytes"].items()},
                               "peak_rss_mib": round(peak / 1024, 1),
                               "model_sha256": sha(out / "model.safetensors")}
            rows[2]["identical_to_1_rank"] = rows[2]["model_sha256"] == rows[1]["model_sha256"]
            results["scaling"].append({"case": name, "model": model, "runs": [rows[1], rows[2]]})

        # --- 2. memory vs depth, with --eval (a real directory: the synthetic weights written out, plus
        #        the LLaMA-2 tokenizer, whose 32000-token vocabulary the shape has)
        text = data / "wikitext2" / "wiki.test.hf_rows_joined_nn.txt"
        for layers in (8, 32):
            directory = work / f"llama-1024-{layers}"
            run([symprune, "prune", "--model", f"synthetic:llama-1024:0:layers={layers}", "--method", "magnitude",
                 "--sparsity", "0", "--out", directory, "--log-level", "warn"])
            shutil.copy(data / "llama2c_tokenizer" / "tokenizer.model", directory / "tokenizer.model")
            for ranks in (1, 2):
                cmd = ([symprune, "prune"] if ranks == 1 else [dist]) + [
                    "--model", directory, "--method", "wanda", "--sparsity", "0.5", "--calib", text, "--nsamples",
                    "32", "--seqlen", "256", "--eval", text, "--eval-seqlen", "256", "--eval-max-chunks", "16",
                    "--threads", 2 // ranks, "--out", work / f"mem-{layers}-{ranks}", "--log-level", "warn"]
                seconds, peak, _ = timed(cmd, ranks, dist=ranks > 1)
                results["memory"].append({"blocks": layers, "ranks": ranks, "peak_rss_mib": round(peak / 1024, 1),
                                          "wall_seconds": round(seconds, 1),
                                          "fp32_weights_of_all_blocks_mib": round(layers * 12_845_056 * 4 / 2**20)})
                shutil.rmtree(work / f"mem-{layers}-{ranks}")
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["machine"]["load_after"] = os.getloadavg()

    out_dir = ROOT / "bench" / "results"
    (out_dir / "dist_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["# symprune_dist on CPU ranks (bench/dist_bench.py)", "",
             f"{results['machine']['cpus']} CPUs; load average before {results['machine']['load_before'][0]:.2f}, "
             f"after {results['machine']['load_after'][0]:.2f}. Timings of a shared 2-core machine: ratios, not "
             "absolute speed.", "",
             "## Per-stage seconds and bytes per block (synthetic:llama-1024, 4 blocks, 32 x 256 calibration)", "",
             "| case | ranks x threads | wall s | weights | dense+pruned passes | statistics | scores+masks | refine | "
             "write | output identical | stats B/block | grams B/block | weights B/block | masks B/block |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for s in results["scaling"]:
        for r in s["runs"]:
            st, b = r["stages"], r["bytes_per_block_rank0"]
            lines.append(f"| {s['case']} | {r['ranks']} x {r['threads_per_rank']} | {r['wall_seconds']} | "
                         f"{st['weights']} | {st['blocks']} | {st['statistics']} | {st['scores_masks']} | "
                         f"{st['refine']} | {st['write']} | {r.get('identical_to_1_rank', 'reference')} | "
                         f"{b['statistics']:,} | {b['grams']:,} | {b['weights']:,} | {b['masks']:,} |")
    lines += ["", "## Peak RSS per rank vs depth (1024 wide, wanda 50 %, 32 x 256 calibration, --eval 16 x 256)", "",
              "| blocks | ranks | peak RSS MiB (max over ranks) | fp32 weights of all blocks MiB | wall s |",
              "|---:|---:|---:|---:|---:|"]
    for m in results["memory"]:
        lines.append(f"| {m['blocks']} | {m['ranks']} | {m['peak_rss_mib']} | {m['fp32_weights_of_all_blocks_mib']} | "
                     f"{m['wall_seconds']} |")
    (out_dir / "dist_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
