#!/usr/bin/env python3
"""Mean reconstruction error before/after refinement on a 1024-wide random LLaMA (issue 14).

The model is written here, seeded, as a Hugging Face directory under a temporary folder (never committed):
LLaMA architecture, hidden 1024, intermediate 2816, 4 blocks, 16 heads, vocab 32000 with the LLaMA-2
SentencePiece tokenizer (../shared/data/llama2c_tokenizer/tokenizer.model, linked, not copied), tied
embeddings, float16. Weights (numpy, seed 0): linears N(0, 1/fan_in), so every block changes the residual
stream as much as the embedding and the inputs of later blocks are mixed by attention and SwiGLU;
embeddings N(0, s_c²) with per-channel scales s_c = exp(0.5·N(0, 1)) and four outlier channels × 8 (the
uneven channel norms of real activations, which is what makes Wanda's order differ from magnitude's);
norms 1. Calibration: the first half of tinystories_val.txt (scripts/split_text.py), 64 windows x 256
tokens, seed 0.

Every run prunes with Wanda at 60 % and 2:4 and refines all 28 linears (--refine-skip none). The table gives
the mean over the 28 linears of recon_error_initial (the initial mask) and recon_error (the refined mask),
both ‖(W−W̃)X‖/‖WX‖ on the run's own dense-pass inputs, the linears whose error rose, the rows the guard
restored and timings.refine.

usage: bench/random_llama_recon.py BUILD_DIR OUT.md
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SYMPRUNE_DATA", ROOT.parent / "shared" / "data"))
HIDDEN, INTERMEDIATE, LAYERS, HEADS, VOCAB = 1024, 2816, 4, 16, 32000
REFINES = [
    ("none", ["--refine", "none"]),
    ("dsnot", ["--refine", "dsnot"]),
    ("dsnot + guard", ["--refine", "dsnot", "--refine-guard"]),
    ("r2dsnot", ["--refine", "r2dsnot"]),
    ("r2dsnot + guard", ["--refine", "r2dsnot", "--refine-guard"]),
    ("recon", ["--refine", "recon"]),
]
SETTINGS = [("60%", ["--sparsity", "0.6"]), ("2:4", ["--nm", "2:4"])]


def write_model(out):
    rng = np.random.default_rng(0)
    out.mkdir(parents=True)
    scale = np.exp(0.5 * rng.standard_normal(HIDDEN))
    scale[rng.choice(HIDDEN, 4, replace=False)] *= 8.0
    tensors = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)) * scale,
               "model.norm.weight": np.ones(HIDDEN)}
    shapes = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
              "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
              "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
              "mlp.down_proj": (HIDDEN, INTERMEDIATE)}
    for i in range(LAYERS):
        prefix = f"model.layers.{i}."
        for name, (rows, cols) in shapes.items():
            tensors[prefix + name + ".weight"] = rng.standard_normal((rows, cols)) / np.sqrt(cols)
        tensors[prefix + "input_layernorm.weight"] = np.ones(HIDDEN)
        tensors[prefix + "post_attention_layernorm.weight"] = np.ones(HIDDEN)
    save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}, indent=2))
    (out / "tokenizer.model").symlink_to(DATA / "llama2c_tokenizer" / "tokenizer.model")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    parser.add_argument("out_md")
    args = parser.parse_args()
    binary = str(Path(args.build_dir).resolve() / "apps" / "symprune")
    work = Path(tempfile.mkdtemp(prefix="random_llama_"))
    model, first, second = work / "model", work / "first.txt", work / "second.txt"
    write_model(model)
    subprocess.run([sys.executable, ROOT / "scripts" / "split_text.py", DATA / "tinystories" / "tinystories_val.txt",
                    first, second], check=True, capture_output=True)
    results = {}
    for setting, mask_args in SETTINGS:
        for label, refine in REFINES:
            report = work / "report.json"
            subprocess.run([binary, "prune", "--model", model, "--method", "wanda", *mask_args, "--calib", first,
                            "--nsamples", "64", "--seqlen", "256", "--seed", "0", *refine, "--refine-skip", "none",
                            "--out", work / "out", "--force", "--report", report], check=True, capture_output=True)
            r = json.loads(report.read_text())
            layers = r["layers"]
            initial = [layer["refine"]["recon_error_initial"] if layer["refine"] else layer["recon_error"]
                       for layer in layers]
            results[f"{label} @ {setting}"] = {
                "before": float(np.mean(initial)),
                "after": float(np.mean([layer["recon_error"] for layer in layers])),
                "rose": sum(1 for layer, e in zip(layers, initial) if layer["recon_error"] > e),
                "rows_reverted": sum(layer["refine"]["rows_reverted"] for layer in layers if layer["refine"]),
                "swaps": sum(layer["refine"]["swaps"] for layer in layers if layer["refine"]),
                "refine_seconds": r["timings"]["refine"],
                "linears": len(layers),
            }
            print(setting, label, results[f"{label} @ {setting}"], flush=True)
    lines = ["# Refinement on a 1024-wide random LLaMA: mean reconstruction error before/after", "",
             "Model, calibration and protocol: see `bench/random_llama_recon.py` (hidden 1024, intermediate 2816, "
             "4 blocks, vocab 32000, seeded N(0, 1/fan_in) linears, embeddings with uneven channel scales; 64 x 256 "
             "TinyStories tokens). Wanda initial mask, all 28 linears refined (--refine-skip none), refinement "
             "defaults. before = mean over the 28 linears of ‖(W−W̃)X‖/‖WX‖ of the initial mask, after = of the "
             "refined mask, each on the run's own dense-pass inputs (later blocks see the inputs that the refined "
             "earlier blocks produce, so `before` differs slightly between runs). rose = linears whose error rose. "
             "refine s = timings.refine of the run (2-core VM, shared).", ""]
    for setting, _ in SETTINGS:
        lines += [f"## Wanda {setting}", "", "| refinement | before | after | change | rose | rows restored | swaps | refine s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for label, _ in REFINES:
            r = results[f"{label} @ {setting}"]
            lines.append(f"| {label} | {r['before']:.4f} | {r['after']:.4f} | {100 * (r['after'] / r['before'] - 1):+.1f} % "
                         f"| {r['rose']}/{r['linears']} | {r['rows_reverted']} | {r['swaps']} | {r['refine_seconds']:.1f} |")
        lines.append("")
    Path(args.out_md).write_text("\n".join(lines))
    Path(args.out_md).with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
