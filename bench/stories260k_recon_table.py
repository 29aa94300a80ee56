#!/usr/bin/env python3
"""stories260K perplexity with DSnoT and R²-DSnoT, each with and without --refine-guard, and recon (issue 14).

Same protocol as bench/stories260k_ppl_table.py (TinyStories second half, seqlen 256, all chunks;
calibration 128 x 256 tokens from the first half, seed 0). Rows: initial method x refinement; columns:
60 %, 70 % (per output row) and 2:4. Refinement defaults (max-cycles 50; DSnoT threshold 0.1, var-power 1;
R²-DSnoT's defaults) and --refine-skip mlp, except "recon, skip none", which refines all 35 linears. Each run
also writes its report: the second table is the mean relative reconstruction error ‖(W−W̃)X‖/‖WX‖ over
all 35 linears (refined or not, each on the calibration inputs of its own run), and the third counts the
rows the guard restored. Writes a Markdown file and the raw JSON beside it.

usage: bench/stories260k_recon_table.py BUILD_DIR OUT.md [--jobs 2]
"""
import concurrent.futures
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stories260k_ppl_table import eval_ppl, prepare  # noqa: E402

BASES = ["magnitude", "wanda", "ria"]
REFINES = [
    ("none", []),
    ("dsnot", ["--refine", "dsnot"]),
    ("dsnot + guard", ["--refine", "dsnot", "--refine-guard"]),
    ("r2dsnot", ["--refine", "r2dsnot"]),
    ("r2dsnot + guard", ["--refine", "r2dsnot", "--refine-guard"]),
    ("recon", ["--refine", "recon"]),
    ("recon, skip none", ["--refine", "recon", "--refine-skip", "none"]),
]
SETTINGS = [("60%", ["--sparsity", "0.6"]), ("70%", ["--sparsity", "0.7"]), ("2:4", ["--nm", "2:4"])]


def run_one(binary, work, model, first, second, base, label, refine, setting, mask_args):
    out_dir = work / re.sub(r"[^A-Za-z0-9]+", "_", f"{base}_{label}_{setting}")
    report_path = out_dir.with_suffix(".json")
    args = [binary, "prune", "--model", model, "--method", base, "--calib", first, "--nsamples", "128",
            "--seqlen", "256", "--seed", "0", "--out", out_dir, "--report", report_path, "--threads", "1",
            *mask_args, *refine]
    start = time.time()
    subprocess.run(list(map(str, args)), capture_output=True, text=True, check=True)
    ppl = eval_ppl(binary, out_dir, second)
    layers = json.loads(report_path.read_text())["layers"]
    subprocess.run(["rm", "-rf", str(out_dir), str(report_path)], check=True)
    errors = [layer["recon_error"] for layer in layers]
    result = {
        "ppl": ppl,
        # magnitude without refinement runs no forward pass, so it has no reconstruction error
        "mean_recon_error": sum(errors) / len(errors) if None not in errors else None,
        "rows_reverted": sum(layer["refine"]["rows_reverted"] for layer in layers if layer["refine"]),
        "refined_linears": sum(1 for layer in layers if layer["refine"]),
        "refined_recon_error_rose": sum(1 for layer in layers if layer["refine"] and
                                        layer["recon_error"] > layer["refine"]["recon_error_initial"]),
        "seconds": time.time() - start,
    }
    return f"{base} + {label}", setting, result


def table(title, rows, fmt):
    lines = [title, "", "| initial + refinement | " + " | ".join(s for s, _ in SETTINGS) + " |",
             "|---|" + "---:|" * len(SETTINGS)]
    for label in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(label, s) for s, _ in SETTINGS) + " |")
    return lines + [""]


def main():
    args, binary, work, model, first, second, dense = prepare("s260k_recon_")
    jobs = [(base, label, refine) for base in BASES for label, refine in REFINES]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, binary, work, model, first, second, base, label, refine, setting, mask_args)
                   for base, label, refine in jobs for setting, mask_args in SETTINGS]
        for f in concurrent.futures.as_completed(futures):
            try:
                row, setting, r = f.result()
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            results[(row, setting)] = r
            print(f"{row:32s} {setting:4s} ppl {r['ppl']:10.4f} err {r['mean_recon_error']} "
                  f"reverted {r['rows_reverted']:5d} ({r['seconds']:.0f} s)", flush=True)
    rows = [f"{base} + {label}" for base, label, _ in jobs]
    lines = ["# stories260K: DSnoT, R²-DSnoT, the refinement guard and recon (symprune, CPU)", "",
             "TinyStories `tinystories_val.txt` second half, seqlen 256, all 777 chunks; calibration: 128 windows "
             "x 256 tokens from the first half, seed 0; unstructured = per output row. Refinement defaults "
             "(max-cycles 50; dsnot: threshold 0.1, var-power 1, no same-sign; r2dsnot: grow- and prune-relative, "
             "refine-alpha 0.5, reg-p 2, gammas 0; recon: pool 96, shortlist 8) with --refine-skip mlp (q/k/v/o "
             "refined, as DSnoT), except \"recon, skip none\" (all 35 linears). \"+ guard\" is --refine-guard. "
             "Generated by `bench/stories260k_recon_table.py`.", "",
             f"Dense: **{dense:.4f}**", ""]
    lines += table("## Perplexity", rows, lambda r, s: f"{results[(r, s)]['ppl']:.3f}")
    lines += table("## Mean ‖(W−W̃)X‖/‖WX‖ over all 35 linears (magnitude alone runs no forward pass: –)", rows,
                   lambda r, s: "–" if results[(r, s)]["mean_recon_error"] is None
                   else f"{results[(r, s)]['mean_recon_error']:.4f}")
    lines += table("## Refined linears whose error rose / rows restored by the guard",
                   [r for r in rows if not r.endswith("+ none")],
                   lambda r, s: f"{results[(r, s)]['refined_recon_error_rose']}/{results[(r, s)]['refined_linears']}"
                                f" / {results[(r, s)]['rows_reverted']}")
    Path(args.out_md).write_text("\n".join(lines))
    Path(args.out_md).with_suffix(".json").write_text(json.dumps(
        {"dense": dense, "runs": {f"{k[0]} @ {k[1]}": v for k, v in sorted(results.items())}}, indent=2) + "\n")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
