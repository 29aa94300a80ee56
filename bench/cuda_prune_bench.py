#!/usr/bin/env python3
"""The end-to-end prune benchmark of issue 10: symprune and the PyTorch loop (bench/pytorch_layerwise.py) on
the same synthetic model, the same calibration size and the same device, for the cases wanda-50, ria-50,
wanda-2:4, wanda-50+dsnot and ria-50+r2dsnot, against the two-pass floor (the FLOPs of the dense and the
pruned forward pass / 800 TFLOP/s). Writes bench/results/cuda_prune_bench.json in the issue's form and a
markdown table beside it.

    python3 bench/cuda_prune_bench.py --symprune build/apps/symprune --model llama2-7b --nsamples 128 \\
        --seqlen 2048 --blocks 4 --symprune-args "--device cuda --dtype bf16" --torch-args "--dtype fp16" \\
        --out bench/results/cuda_prune_bench

--blocks K (at least 2) prunes the first K blocks only (symprune: a synthetic model of K blocks; PyTorch:
--blocks K) and extrapolates to all L blocks: the K blocks' times plus (L - K) times a typical block's,
stage by stage (both tools report each block's times), saying so in the JSON. Not K/L times the whole run:
what happens once (starting CUDA, the embeddings, the first block's weights read on the calling thread, the
libraries' first calls) would be counted L/K times. symprune's typical block is the median of blocks
1..K-2: neither the first nor the last, which reads no next block in the background as every block of the
whole model but its last does (with K = 2, block 1). The PyTorch loop reads nothing ahead: its last block. The PyTorch loop has no DSnoT: the refined cases
record its unrefined time (the issue's ratio is against the loop the public tools run).
"""
import argparse
import json
import shlex
import subprocess
import sys
import os
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pytorch_layerwise import PRESETS  # noqa: E402

CASES = {
    "wanda-50": (["--method", "wanda", "--sparsity", "0.5"], ["--method", "wanda", "--sparsity", "0.5"]),
    "ria-50": (["--method", "ria", "--sparsity", "0.5"], ["--method", "ria", "--sparsity", "0.5"]),
    "wanda-2:4": (["--method", "wanda", "--nm", "2:4"], ["--method", "wanda", "--nm", "2:4"]),
    "wanda-50-dsnot": (["--method", "wanda", "--sparsity", "0.5", "--refine", "dsnot"],
                       ["--method", "wanda", "--sparsity", "0.5"]),
    "ria-50-r2dsnot": (["--method", "ria", "--sparsity", "0.5", "--refine", "r2dsnot"],
                       ["--method", "ria", "--sparsity", "0.5"]),
}
FLOOR_FLOPS_PER_SECOND = 800e12
# The stages, as symprune's report names them ("blocks", their sum, is not a column of its own).
STAGE_COLUMNS = [("weights", "weights"), ("dense_pass", "dense pass"), ("statistics", "statistics"),
                 ("scores_masks", "scores and masks"), ("refine", "refinement"), ("pruned_pass", "pruned pass")]


def forward_flops(preset, nsamples, seqlen, blocks):
    """FLOPs of one forward pass over the calibration windows through `blocks` blocks: 2 per weight per
    token for the linears, plus causal attention (QK^T and PV: 2 * 2 * T/2 * d per token on average)."""
    d, _, heads, kv, ffn, _, _ = PRESETS[preset]
    kv_dim = d * kv // heads
    weights = 2 * d * d + 2 * d * kv_dim + 3 * d * ffn
    tokens = nsamples * seqlen
    return blocks * tokens * (2 * weights + 2 * seqlen * d)


class RunFailed(Exception):
    pass


def run(command, env=None):
    """Runs `command`; returns its stderr."""
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RunFailed(f"{' '.join(map(str, command))} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stderr


PROFILE_HEADER = "cuda backend ops (SYMPRUNE_CUDA_PROFILE)"


def op_profile(stderr):
    """The CUDA backend's table of time per op (SYMPRUNE_CUDA_PROFILE=1) from symprune's stderr, as lines."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(PROFILE_HEADER):
            return [line] + [rest for rest in lines[i + 1:] if rest.startswith("  ")]
    return None


def gpu_name():
    """The first GPU's name from nvidia-smi (for --no-torch runs), or None."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    return names[0].strip() if names else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--symprune", default=str(HERE.parent / "build" / "apps" / "symprune"))
    parser.add_argument("--model", default="llama2-7b", choices=sorted(PRESETS))
    parser.add_argument("--nsamples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=0,
                        help="time the first K blocks and extrapolate from the last of them (0: all)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--symprune-args", default="", help="more symprune options (e.g. --device cuda)")
    parser.add_argument("--torch-args", default="", help="more pytorch_layerwise.py options (e.g. --dtype fp16)")
    parser.add_argument("--no-torch", action="store_true", help="symprune only")
    parser.add_argument("--profile", action="store_true",
                        help="symprune with SYMPRUNE_CUDA_PROFILE=1: each case gets the CUDA backend's time per op "
                             "(op_profile; every op then waits for the device, so its times are not the benchmark's)")
    parser.add_argument("--out", default=str(HERE / "results" / "cuda_prune_bench"), help="path without suffix")
    args = parser.parse_args()

    layers = PRESETS[args.model][1]
    blocks = args.blocks or layers
    if not 2 <= blocks <= layers:
        parser.error(f"--blocks must be between 2 and {layers} (the model's blocks): one block is the first, whose "
                     "weights are read on the calling thread, and cannot stand for the others")
    model = f"synthetic:{args.model}" + (f":layers={blocks}" if blocks != layers else "")
    pass_flops = forward_flops(args.model, args.nsamples, args.seqlen, layers)
    floor = 2 * pass_flops / FLOOR_FLOPS_PER_SECOND
    result = {"device": None, "model": f"synthetic:{args.model}", "nsamples": args.nsamples,
              "seqlen": args.seqlen, "blocks_timed": blocks, "blocks": layers,
              "scaled": (f"{blocks} blocks timed, the other {layers - blocks} counted at a typical timed block's "
                         "times" if blocks != layers else None), "cases": []}
    out = Path(args.out)
    failed = []
    # The files are rewritten after every case: a call stopped at its time limit keeps the cases it finished.
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            try:
                case = run_case(args, name, model, layers, (floor, pass_flops), blocks, Path(tmp), result)
            except RunFailed as e:
                failed.append(name)
                case = {"case": name, "error": str(e)[-2000:]}
                print(f"{name}: {e}", file=sys.stderr, flush=True)
            result["cases"].append(case)
            print(json.dumps(case), flush=True)
            write_outputs(result, out, args, floor)
    result["device"] = result["device"] or gpu_name() or "unknown (symprune only)"
    write_outputs(result, out, args, floor)
    print(f"wrote {out.with_suffix('.json')} and .md")
    if failed:
        raise SystemExit(f"cases that failed: {', '.join(failed)}")


def extrapolate(measured, typical_block, missing_blocks):
    """A timed run's seconds (or stages) with `missing_blocks` more blocks like `typical_block`."""
    return measured + missing_blocks * typical_block


def typical_block(block_timings):
    """symprune's block to extrapolate from: the median (by seconds) of blocks 1..K-2, or block 1 of two."""
    middle = block_timings[1:-1] or block_timings[1:]
    return sorted(middle, key=lambda b: b["seconds"])[(len(middle) - 1) // 2]


def run_case(args, name, model, layers, floor_and_pass_flops, blocks, tmp, result):
    """One case: symprune (and the PyTorch loop unless --no-torch), times extrapolated to the whole model, and
    the rate each forward pass achieved (one pass's FLOPs over its stage's seconds)."""
    floor, pass_flops = floor_and_pass_flops
    missing = layers - blocks
    ours, theirs = CASES[name]
    report = tmp / f"{name}.json"
    env = dict(os.environ, SYMPRUNE_CUDA_PROFILE="1") if args.profile else None
    stderr = run([args.symprune, "prune", "--model", model, "--calib", "synthetic", "--nsamples", str(args.nsamples),
                  "--seqlen", str(args.seqlen), "--no-recon-error", *ours, *shlex.split(args.symprune_args),
                  "--report", str(report)], env)
    ours_report = json.loads(report.read_text())
    timings, typical = ours_report["timings"], typical_block(ours_report["block_timings"])
    case = {"case": name, "seconds": extrapolate(timings["total"], typical["seconds"], missing),
            "floor_seconds": floor, "extrapolated_from_block": typical["block"] if missing else None,
            "symprune_device": ours_report["config"]["device"], "symprune_dtype": ours_report["config"]["dtype"],
            "stages": {k: extrapolate(v, typical.get(k, 0.0), missing) for k, v in timings.items() if k != "total"},
            "block_timings": ours_report["block_timings"],
            "device_memory": ours_report.get("device_memory")}
    case["pass_tflops"] = {stage: pass_flops / case["stages"][stage] / 1e12 if case["stages"].get(stage) else None
                           for stage in ("dense_pass", "pruned_pass")}
    if args.profile:
        case["op_profile"] = op_profile(stderr)
    if not args.no_torch:
        torch_json = tmp / f"{name}.torch.json"
        run([sys.executable, str(HERE / "pytorch_layerwise.py"), "--synthetic", args.model, "--nsamples",
             str(args.nsamples), "--seqlen", str(args.seqlen), "--blocks", str(blocks), *theirs,
             *shlex.split(args.torch_args), "--json", str(torch_json)])
        torch_result = json.loads(torch_json.read_text())
        last = torch_result["block_stages"][-1]
        case["pytorch_seconds"] = extrapolate(torch_result["seconds_without_weights"],
                                              sum(v for k, v in last.items() if k != "weights"), missing)
        case["pytorch_stages"] = {k: extrapolate(v, last[k], missing) for k, v in torch_result["stages"].items()}
        case["pytorch_pass_tflops"] = {stage: pass_flops / case["pytorch_stages"][stage] / 1e12
                                       for stage in ("dense_pass", "pruned_pass") if case["pytorch_stages"].get(stage)}
        result["device"] = result["device"] or torch_result["device"]
        result["torch"] = torch_result["torch"]
    return case


def gib(value):
    return f"{value / 2**30:.1f}" if value is not None else "–"


def write_outputs(result, out, args, floor):
    """The JSON of the issue's form and a markdown table beside it."""
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# End-to-end prune: {result['model']}, {args.nsamples} x {args.seqlen}, {result['device']}", "",
             f"Floor: the two forward passes' FLOPs / 800 TFLOP/s = {floor:.2f} s."
             + (f" {result['scaled']}." if result["scaled"] else ""), "",
             "| case | symprune (s) | x floor | PyTorch loop (s) | PyTorch / symprune | device memory planned / "
             "peak (GiB) |", "|---|---:|---:|---:|---:|---:|"]
    for c in result["cases"]:
        if "error" in c:
            lines.append(f"| {c['case']} | failed (see the JSON) | | | | |")
            continue
        torch_s = c.get("pytorch_seconds")
        memory = c.get("device_memory") or {}
        lines.append(f"| {c['case']} | {c['seconds']:.2f} | {c['seconds'] / floor:.1f} | "
                     + (f"{torch_s:.2f} | {torch_s / c['seconds']:.1f} |" if torch_s else "– | – |")
                     + f" {gib(memory.get('planned'))} / {gib(memory.get('peak_used'))} |")
    lines += ["", "symprune's stages (s) and the rate of its forward passes; \"other\" is the rest of the run (start, "
              "calibration, embeddings, the first block's wait for its weights outside the stages).", "",
              "| case | " + " | ".join(title for _, title in STAGE_COLUMNS) + " | other | dense pass TFLOP/s | "
              "pruned pass TFLOP/s |", "|---|" + "---:|" * (len(STAGE_COLUMNS) + 3)]
    for c in result["cases"]:
        if "error" in c:
            continue
        stages, rates = c["stages"], c.get("pass_tflops") or {}
        other = c["seconds"] - sum(stages.get(key, 0.0) for key, _ in STAGE_COLUMNS)
        lines.append(f"| {c['case']} | " + " | ".join(f"{stages.get(key, 0.0):.2f}" for key, _ in STAGE_COLUMNS)
                     + f" | {other:.2f} | " + " | ".join(f"{rates[k]:.3g}" if rates.get(k) else "–"
                                                         for k in ("dense_pass", "pruned_pass")) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
