#!/usr/bin/env python3
"""Collects a sweep (slurm/submit_sweep.sh) into one table: SWEEP_DIR/results.json and results.md, one row per
cell of SWEEP_DIR/grid.tsv in grid order, from each cell's report.json: method, mask, refinement, achieved sparsity,
dense and pruned perplexity, time (all starts of a requeued cell together), how many times it resumed,
status. A cell without a report (failed, cancelled, still running) is a row with status "missing".

    python3 slurm/collect_sweep.py SWEEP_DIR

Exit status 0 when every cell has a finished report, 1 when some are missing (the table is written anyway),
2 on a bad sweep directory. Standard library only: runs with any python3 on a login or compute node."""
import json
import os
import sys
from pathlib import Path


def read_cells(grid):
    cells = []
    for number, line in enumerate(grid.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, *options = line.split(None, 1)
        cells.append({"cell": name, "options": options[0] if options else "", "line": number})
    return cells


def mask_of(config):
    if config.get("nm"):
        return config["nm"]
    group = config.get("group", "row")
    return f"{config.get('sparsity')} per {group}"


def refine_of(config):
    refine = config.get("refine")
    if not isinstance(refine, dict):
        return "none"
    return refine.get("method", "?") + (" guarded" if refine.get("guard") else "")


def row_for(cell, sweep):
    report_path = sweep / cell["cell"] / "report.json"
    row = {**cell, "status": "missing", "method": None, "mask": None, "refine": None, "sparsity": None,
           "perplexity_dense": None, "perplexity_pruned": None, "seconds": None, "resumed_at_block": None,
           "report": str(report_path)}
    if not report_path.exists():
        return row
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as error:
        row["status"] = f"unreadable report: {error}"
        return row
    config = report.get("config", {})
    perplexity = report.get("perplexity") or {}
    resumed = report.get("resumed") or {}
    row.update({
        "status": "incomplete" if report.get("incomplete") else "done",
        "method": config.get("method"),
        "mask": mask_of(config),
        "refine": refine_of(config),
        "sparsity": report.get("sparsity", {}).get("total"),
        "perplexity_dense": perplexity.get("dense"),
        "perplexity_pruned": perplexity.get("pruned"),
        "seconds": report.get("timings", {}).get("total"),
        "resumed_at_block": resumed.get("block"),
    })
    return row


def fmt(value, digits):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(rows, sweep):
    lines = [f"# Sweep {sweep}", "",
             "| cell | method | mask | refine | sparsity | dense ppl | pruned ppl | time (s) | resumed at block "
             "| status |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['cell']} | {fmt(r['method'], 0)} | {fmt(r['mask'], 0)} | {fmt(r['refine'], 0)} | "
                     f"{fmt(r['sparsity'], 4)} | "
                     f"{fmt(r['perplexity_dense'], 3)} | {fmt(r['perplexity_pruned'], 3)} | "
                     f"{fmt(r['seconds'], 1)} | {fmt(r['resumed_at_block'], 0)} | {r['status']} |")
    done = sum(r["status"] == "done" for r in rows)
    lines += ["", f"{done} of {len(rows)} cells done. Options per cell: grid.tsv; common options: "
              "common_options.txt.", ""]
    return "\n".join(lines)


def write_atomically(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sweep = Path(argv[1]).resolve()
    grid = sweep / "grid.tsv"
    if not grid.is_file():
        print(f"collect_sweep: {grid} not found: is {sweep} a sweep directory of submit_sweep.sh?",
              file=sys.stderr)
        return 2
    rows = [row_for(cell, sweep) for cell in read_cells(grid)]
    write_atomically(sweep / "results.json", json.dumps({"sweep": str(sweep), "rows": rows}, indent=2) + "\n")
    write_atomically(sweep / "results.md", markdown(rows, sweep))
    missing = [r["cell"] for r in rows if r["status"] != "done"]
    print(f"collect_sweep: {len(rows) - len(missing)} of {len(rows)} cells done; table in {sweep / 'results.md'}")
    if missing:
        print(f"collect_sweep: not done: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
