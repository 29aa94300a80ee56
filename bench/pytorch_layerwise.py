#!/usr/bin/env python3
"""The layer-wise pruning loop written in PyTorch the way the public tools do it (locuslab/wanda
lib/prune.py, RIA main.py): the calibration hidden states of all windows kept on the device, each block
run once per window (batch 1) with forward hooks accumulating Wanda's running `scaler_row`, every
linear's score sorted per row with `torch.sort` (N:M: `torch.topk` per group), the mask applied, the
block run again per window for the next block's inputs. It is the baseline symprune's CUDA benchmark is
measured against (issue 10: "at least 5x faster than the PyTorch loop on the same GPU").

Plain torch only (the GPU machine has PyTorch but no transformers): the LLaMA block is written here
(RMSNorm, RoPE, grouped-query causal attention, SiLU MLP), matching Hugging Face's LlamaDecoderLayer.

    # a real model (safetensors, needs the safetensors package) and symprune's calibration windows
    python3 bench/pytorch_layerwise.py --model DIR --calib-tokens calib.u32 --nsamples 128 --seqlen 2048 \\
        --method wanda --sparsity 0.5 --device cuda --dtype fp16 --json out.json
    # a synthetic model of a real shape (random weights made on the device, not timed), random tokens
    python3 bench/pytorch_layerwise.py --synthetic llama2-7b --nsamples 128 --seqlen 2048 --method wanda \\
        --nm 2:4 --device cuda --dtype fp16 --blocks 4 --json out.json

--blocks K times the first K blocks only (scale by layers/K for the whole model; the JSON says both).
--save-masks FILE.npz keeps the masks ("<block>.<linear>": bool, True = pruned) for parity tests.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path


def limit_blas_threads(argv):
    """--threads N must bind every pool torch computes with. torch.set_num_threads alone does not: a torch
    built on a system BLAS (Debian's) runs its GEMMs on that library's own threads, which read their count
    from the environment when the library loads, so it is set here (unless the environment sizes it), before
    numpy and torch are imported.
    (Measured on the 2-core VM: --threads 1 without this used 176 % CPU.)"""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--threads=") else (
            argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else None)
        if value is not None and value.isdigit() and int(value) > 0:
            for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
                os.environ.setdefault(name, value)  # a pool sized explicitly in the environment stays so


limit_blas_threads(sys.argv[1:])

import numpy as np  # noqa: E402 (after the thread limits above)
import torch  # noqa: E402
import torch.nn.functional as F

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
# hidden, layers, heads, kv heads, intermediate, vocab, rope theta
PRESETS = {
    "llama2-7b": (4096, 32, 32, 32, 11008, 32000, 10000.0),
    "llama2-13b": (5120, 40, 40, 40, 13824, 32000, 10000.0),
    "llama2-70b": (8192, 80, 64, 8, 28672, 32000, 10000.0),
    "llama3-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0),
    "llama-1024": (1024, 4, 16, 16, 2816, 32000, 10000.0),  # symprune's small synthetic shape (CPU runs)
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class Block(torch.nn.Module):
    """One LLaMA decoder block (Hugging Face layout and parameter names)."""

    def __init__(self, cfg, weights, device, dtype):
        super().__init__()
        self.cfg = cfg
        self.linears = torch.nn.ModuleDict()
        for name in LINEARS:
            w = weights[name]
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=device, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
            self.linears[name.replace(".", "_")] = lin
        self.norm1 = weights["input_layernorm"].to(device, dtype)
        self.norm2 = weights["post_attention_layernorm"].to(device, dtype)

    def linear(self, name):
        return self.linears[name.replace(".", "_")]

    def rms(self, x, weight):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(var + self.cfg["eps"])).to(x.dtype)

    def forward(self, x, cos, sin):
        c = self.cfg
        b, t, _ = x.shape
        hd = c["hidden"] // c["heads"]
        h = self.rms(x, self.norm1)
        q = self.linear("self_attn.q_proj")(h).view(b, t, c["heads"], hd).transpose(1, 2)
        k = self.linear("self_attn.k_proj")(h).view(b, t, c["kv_heads"], hd).transpose(1, 2)
        v = self.linear("self_attn.v_proj")(h).view(b, t, c["kv_heads"], hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        groups = c["heads"] // c["kv_heads"]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            a = torch.softmax(scores.masked_fill(causal, float("-inf")).float(), dim=-1).to(q.dtype) @ v
        x = x + self.linear("self_attn.o_proj")(a.transpose(1, 2).reshape(b, t, -1))
        h = self.rms(x, self.norm2)
        gate, up = self.linear("mlp.gate_proj")(h), self.linear("mlp.up_proj")(h)
        return x + self.linear("mlp.down_proj")(F.silu(gate) * up)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_tables(cfg, seqlen, device, dtype):
    hd = cfg["hidden"] // cfg["heads"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float32, device=device), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class ScalerRow:
    """Wanda's WrappedGPU.add_batch: a running mean of ||x_c||^2 over the tokens seen, in fp32."""

    def __init__(self, columns, device):
        self.scaler_row = torch.zeros(columns, device=device)
        self.nsamples = 0

    def add_batch(self, inp):
        inp = inp.reshape(-1, inp.shape[-1]).t()  # [n, tokens]
        tmp = 1
        self.scaler_row *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        inp = inp.type(torch.float32)
        self.scaler_row += torch.norm(inp, p=2, dim=1) ** 2 / self.nsamples


def score(method, weight, scaler_row, alpha):
    w = weight.abs().float()
    act = torch.sqrt(scaler_row.reshape(1, -1))
    if method == "wanda":
        return w * act
    if method == "ria":
        ri = w / torch.sum(w, dim=0) + w / torch.sum(w, dim=1).reshape(-1, 1)
        return ri * act ** alpha
    if method == "magnitude":
        return w
    raise ValueError(f"unknown method {method}")


def mask_of(metric, sparsity, nm):
    """True = pruned. Unstructured: per row, the int(n * sparsity) lowest (torch.sort, stable);
    N:M: the N lowest of every M consecutive columns (torch.topk)."""
    mask = torch.zeros_like(metric, dtype=torch.bool)
    if nm:
        n, m = nm
        for col in range(0, metric.shape[1], m):
            tmp = metric[:, col:col + m].float()
            mask.scatter_(1, col + torch.topk(tmp, n, dim=1, largest=False)[1], True)
    else:
        order = torch.sort(metric, dim=-1, stable=True)[1]
        mask.scatter_(1, order[:, :int(metric.shape[1] * sparsity)], True)
    return mask


def synthetic_weights(cfg, generator, device, dtype):
    d, ffn, hd = cfg["hidden"], cfg["ffn"], cfg["hidden"] // cfg["heads"]
    kv = cfg["kv_heads"] * hd
    shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
              "self_attn.o_proj": (d, d), "mlp.gate_proj": (ffn, d), "mlp.up_proj": (ffn, d),
              "mlp.down_proj": (d, ffn)}
    out = {k: torch.randn(s, generator=generator, device=device, dtype=torch.float32).mul_(0.02).to(dtype)
           for k, s in shapes.items()}
    out["input_layernorm"] = torch.ones(d, device=device, dtype=dtype)
    out["post_attention_layernorm"] = torch.ones(d, device=device, dtype=dtype)
    return out


class HfModel:
    """A Hugging Face LLaMA directory (config.json, *.safetensors) read tensor by tensor."""

    def __init__(self, directory):
        from safetensors import safe_open  # only for real models
        self.dir = Path(directory)
        c = json.loads((self.dir / "config.json").read_text())
        self.cfg = {"hidden": c["hidden_size"], "layers": c["num_hidden_layers"], "heads": c["num_attention_heads"],
                    "kv_heads": c.get("num_key_value_heads", c["num_attention_heads"]),
                    "ffn": c["intermediate_size"], "vocab": c["vocab_size"],
                    "rope_theta": c.get("rope_theta", 10000.0), "eps": c.get("rms_norm_eps", 1e-6)}
        self.files = {}
        for path in sorted(self.dir.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    self.files[key] = path
        self.safe_open = safe_open

    def tensor(self, name):
        with self.safe_open(str(self.files[name]), framework="pt") as f:
            return f.get_tensor(name)

    def block_weights(self, i):
        prefix = f"model.layers.{i}."
        out = {name: self.tensor(prefix + name + ".weight") for name in LINEARS}
        out["input_layernorm"] = self.tensor(prefix + "input_layernorm.weight")
        out["post_attention_layernorm"] = self.tensor(prefix + "post_attention_layernorm.weight")
        return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="Hugging Face LLaMA directory")
    source.add_argument("--synthetic", choices=sorted(PRESETS), help="random weights of a real shape")
    parser.add_argument("--calib-tokens", help="u32 token ids [nsamples, seqlen] (symprune calib --out); "
                                               "default: uniformly random ids from --seed")
    parser.add_argument("--nsamples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--method", choices=["magnitude", "wanda", "ria"], default="wanda")
    parser.add_argument("--alpha", type=float, default=0.5, help="ria's activation exponent (default 0.5)")
    mask = parser.add_mutually_exclusive_group(required=True)
    mask.add_argument("--sparsity", type=float)
    mask.add_argument("--nm", help="N:M, e.g. 2:4")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--blocks", type=int, default=0, help="time only the first K blocks (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of torch (0: torch's default)")
    parser.add_argument("--save-masks", help="npz file for the masks")
    parser.add_argument("--json", help="write the timings here")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    nm = tuple(int(v) for v in args.nm.split(":")) if args.nm else None
    generator = torch.Generator(device=device).manual_seed(args.seed)
    if args.model:
        model = HfModel(args.model)
        cfg = model.cfg
        embed = model.tensor("model.embed_tokens.weight")
    else:
        d, layers, heads, kv, ffn, vocab, theta = PRESETS[args.synthetic]
        cfg = {"hidden": d, "layers": layers, "heads": heads, "kv_heads": kv, "ffn": ffn, "vocab": vocab,
               "rope_theta": theta, "eps": 1e-5}
        model, embed = None, None
    if args.calib_tokens:
        tokens = np.fromfile(args.calib_tokens, dtype="<u4").astype(np.int64)
        if tokens.size != args.nsamples * args.seqlen:
            parser.error(f"{args.calib_tokens} holds {tokens.size} tokens, not {args.nsamples} x {args.seqlen}")
        tokens = torch.from_numpy(tokens.reshape(args.nsamples, args.seqlen)).to(device)
    else:
        tokens = torch.randint(0, cfg["vocab"], (args.nsamples, args.seqlen), generator=generator, device=device)
    blocks = args.blocks or cfg["layers"]

    stages = {"weights": 0.0, "dense_pass": 0.0, "scores_masks": 0.0, "pruned_pass": 0.0}
    block_stages = []  # each block's share of `stages`
    sync(device)
    start = time.perf_counter()
    if embed is not None:
        inps = embed.to(device, dtype)[tokens]
    else:  # the embedding rows of a synthetic model: random, like its weights
        inps = torch.randn(args.nsamples, args.seqlen, cfg["hidden"], generator=generator, device=device).to(dtype)
    outs = torch.zeros_like(inps)
    cos, sin = rope_tables(cfg, args.seqlen, device, dtype)
    masks = {}
    with torch.no_grad():
        for i in range(blocks):
            before = dict(stages)
            sync(device)
            t = time.perf_counter()
            weights = model.block_weights(i) if model else synthetic_weights(cfg, generator, device, dtype)
            block = Block(cfg, weights, device, dtype)
            del weights
            sync(device)
            stages["weights"] += time.perf_counter() - t

            t = time.perf_counter()
            scalers = {name: ScalerRow(block.linear(name).in_features, device) for name in LINEARS}
            hooks = [block.linear(name).register_forward_hook(
                lambda _m, inp, _out, s=scalers[name]: s.add_batch(inp[0].data)) for name in LINEARS]
            for j in range(args.nsamples):
                outs[j] = block(inps[j].unsqueeze(0), cos, sin)[0]
            for h in hooks:
                h.remove()
            sync(device)
            stages["dense_pass"] += time.perf_counter() - t

            t = time.perf_counter()
            for name in LINEARS:
                w = block.linear(name).weight.data
                pruned = mask_of(score(args.method, w, scalers[name].scaler_row, args.alpha), args.sparsity, nm)
                w[pruned] = 0
                if args.save_masks:
                    masks[f"{i}.{name}"] = pruned.cpu().numpy()
            sync(device)
            stages["scores_masks"] += time.perf_counter() - t

            t = time.perf_counter()
            for j in range(args.nsamples):
                outs[j] = block(inps[j].unsqueeze(0), cos, sin)[0]
            sync(device)
            stages["pruned_pass"] += time.perf_counter() - t
            inps, outs = outs, inps
            del block
            block_stages.append({k: stages[k] - before[k] for k in stages})
    sync(device)
    seconds = time.perf_counter() - start
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "model": args.model or f"synthetic:{args.synthetic}",
              "method": args.method, "mask": args.nm or f"{args.sparsity} per row", "dtype": args.dtype,
              "threads": torch.get_num_threads(), "nsamples": args.nsamples, "seqlen": args.seqlen, "blocks_timed": blocks, "blocks": cfg["layers"],
              "seconds": seconds, "seconds_without_weights": seconds - stages["weights"],
              "seconds_all_blocks": seconds + (cfg["layers"] - blocks) * sum(block_stages[-1].values()),
              "stages": stages,
              "block_stages": block_stages}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.save_masks:
        np.savez(args.save_masks, **masks)


if __name__ == "__main__":
    main()
