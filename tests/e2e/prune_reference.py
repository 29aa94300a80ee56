"""An independent implementation of symprune's layer-wise pruning pipeline for LLaMA-architecture models
(LLaMA; the biases of Qwen2 and of Qwen3's attention; Qwen3's per-head q/k RMSNorms), in numpy.

Written from the definitions (DESIGN.md §3), not from symprune's code, so the end-to-end tests can
compare masks. Everything runs in float64: the forward pass (RMSNorm, rotate-half RoPE, grouped-query
causal attention, SwiGLU), the activation statistics and the scores. symprune runs its forward in
fp32 and rounds its scores to fp32, so the two may only disagree where two scores nearly tie;
`compare_masks` finds every disagreement and measures how near the tie is.

Pipeline (DESIGN.md §3.5): embed the N calibration windows of T tokens; for each block: a dense pass
collecting, per linear, the input column norms a_c = sqrt(Σ_t X[t,c]² / N); score and mask every
linear of the block; a pruned pass whose output is the next block's input.

Scores (smaller = pruned first):  magnitude |W|;  wanda |W|·a_c^α (α=1);
ria (|W|/Σ_c'|W[r,c']| + |W|/Σ_r'|W[r',c]|)·a_c^α (α=0.5).
Masks: per output row, prune the k = ⌊n·ρ⌋ smallest, ties to the lower column; N:M: in each group of
M consecutive input columns of a row, prune the N smallest, ties to the lower index. A stable argsort
gives exactly these tie rules.
"""
import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
DTYPE = np.float64


def load_model(model_dir):
    """config dict and {tensor name: float64 array} from a Hugging Face LLaMA directory."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    weights = {}
    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    for name in files:
        for key, value in load_file(str(model_dir / name)).items():
            weights[key] = value.astype(DTYPE)
    return config, weights


def read_tokens_u32(path, nsamples, seqlen):
    data = np.fromfile(path, dtype="<u4")
    assert data.size == nsamples * seqlen, (data.size, nsamples, seqlen)
    return data.reshape(nsamples, seqlen).astype(np.int64)


class Llama:
    def __init__(self, config, weights):
        self.config = config
        self.w = weights
        self.dim = config["hidden_size"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads", self.n_heads)
        # Qwen3's heads need not be dim / n_heads wide (its config's default is 128).
        self.head_dim = config.get("head_dim") or (128 if config.get("model_type") == "qwen3"
                                                   else self.dim // self.n_heads)
        self.eps = config["rms_norm_eps"]
        self.n_layers = config["num_hidden_layers"]
        theta = config.get("rope_theta", 10000.0)
        assert config.get("rope_scaling") is None, "rope scaling is not implemented in the reference"
        assert config.get("hidden_act", "silu") == "silu"
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=DTYPE) / self.head_dim)

    def linear_weight(self, block, name):
        return self.w[f"model.layers.{block}.{name}.weight"]

    def embed(self, tokens):
        return self.w["model.embed_tokens.weight"][tokens]  # [N, T, d]

    def rmsnorm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x):
        """x [N, heads, T, hd]; HF rotate-half layout, positions 0..T-1 in every window."""
        t = x.shape[2]
        freqs = np.outer(np.arange(t, dtype=DTYPE), self.inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def block(self, i, h, weights=None, observe=None):
        """One decoder block on h [N, T, d]. `weights`: {linear name: [m, n]} replacing the stored ones.
        `observe(name, X)` sees the input [N*T, n] of every linear."""
        weights = weights or {}
        W = lambda name: weights.get(name, self.linear_weight(i, name))
        n, t, d = h.shape

        def lin(name, x):
            x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
            if observe is not None:
                observe(name, x2)
            y = x2 @ W(name).T
            bias = self.w.get(f"model.layers.{i}.{name}.bias")  # Qwen2's q/k/v, Qwen3's attention_bias
            return (y if bias is None else y + bias).reshape(*x.shape[:-1], -1)

        def heads(name, x, count):
            y = lin(f"self_attn.{name}_proj", x).reshape(n, t, count, self.head_dim)
            norm = self.w.get(f"model.layers.{i}.self_attn.{name}_norm.weight")  # Qwen3: RMSNorm per head
            return (y if norm is None else self.rmsnorm(y, norm)).transpose(0, 2, 1, 3)

        x = self.rmsnorm(h, self.w[f"model.layers.{i}.input_layernorm.weight"])
        q = heads("q", x, self.n_heads)
        k = heads("k", x, self.n_kv)
        v = heads("v", x, self.n_kv)
        q, k = self.rope(q), self.rope(k)
        group = self.n_heads // self.n_kv
        k = np.repeat(k, group, axis=1)  # head j uses kv head j // group, as HF repeat_kv
        v = np.ascontiguousarray(np.repeat(v, group, axis=1))
        # Contiguous operands let numpy hand each window/head product to BLAS.
        att = np.ascontiguousarray(q) @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(self.head_dim)
        att = np.where(np.tril(np.ones((t, t), dtype=bool)), att, -np.inf)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(n, t, self.n_heads * self.head_dim)
        h = h + lin("self_attn.o_proj", o)

        x = self.rmsnorm(h, self.w[f"model.layers.{i}.post_attention_layernorm.weight"])
        g = lin("mlp.gate_proj", x)
        u = lin("mlp.up_proj", x)
        return h + lin("mlp.down_proj", g / (1.0 + np.exp(-g)) * u)

    def hidden_states(self, tokens):
        """Like transformers' output_hidden_states: embeddings, each block's output, the last one normed."""
        h = self.embed(tokens)
        states = [h]
        for i in range(self.n_layers):
            h = self.block(i, h)
            states.append(h)
        states[-1] = self.rmsnorm(h, self.w["model.norm.weight"])
        return states

    def logits(self, h):
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return self.rmsnorm(h, self.w["model.norm.weight"]) @ head.T


# ---- scores and masks -----------------------------------------------------------------------------

DEFAULT_ALPHA = {"magnitude": None, "wanda": 1.0, "ria": 0.5}


def scores(method, w, a, alpha=None):
    """S[r, c] for W [m, n] and input norms a [n]."""
    alpha = DEFAULT_ALPHA[method] if alpha is None else alpha
    aw = np.abs(w)
    if method == "magnitude":
        return aw
    if method == "wanda":
        return aw * a[None, :] ** alpha
    if method == "ria":
        row = aw.sum(axis=1, keepdims=True)
        col = aw.sum(axis=0, keepdims=True)
        return (aw / row + aw / col) * a[None, :] ** alpha
    raise ValueError(f"method {method!r} is not in the reference")


def mask_unstructured(s, sparsity):
    """True = pruned: per row the k = ⌊n·ρ⌋ smallest, ties to the lower column."""
    m, n = s.shape
    k = int(n * sparsity)
    order = np.argsort(s, axis=1, kind="stable")[:, :k]
    mask = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    return mask


def mask_nm(s, n_prune, m_group):
    """True = pruned: in each group of m_group consecutive columns of a row, the n_prune smallest."""
    rows, n = s.shape
    assert n % m_group == 0
    g = s.reshape(rows, n // m_group, m_group)
    order = np.argsort(g, axis=2, kind="stable")[:, :, :n_prune]
    mask = np.zeros(g.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=2)
    return mask.reshape(rows, n)


def make_mask(s, sparsity=None, nm=None):
    return mask_nm(s, *nm) if nm is not None else mask_unstructured(s, sparsity)


def prune(model, tokens, method, sparsity=None, nm=None, alpha=None):
    """The layer-wise pipeline. Returns {"model.layers.i.<linear>.weight": (mask, scores, recon)},
    recon = ‖(W − W̃)X‖_F / ‖WX‖_F on that linear's dense-pass inputs X (None for magnitude, which
    runs no forward pass)."""
    assert (sparsity is None) != (nm is None)
    result = {}
    needs_activations = method != "magnitude"  # magnitude masks depend on the weights only
    h = model.embed(tokens) if needs_activations else None
    n_windows = tokens.shape[0] if needs_activations else 1
    for i in range(model.n_layers):
        sumsq = {}
        inputs = {}

        def observe(name, x):
            sumsq[name] = sumsq.get(name, 0.0) + np.sum(x * x, axis=0)
            inputs[name] = x.copy()

        if needs_activations:
            model.block(i, h, observe=observe)  # dense pass: statistics and inputs only
        else:
            sumsq = {name: np.ones(model.linear_weight(i, name).shape[1]) for name in LINEARS}
        pruned = {}
        for name in LINEARS:
            w = model.linear_weight(i, name)
            a = np.sqrt(sumsq[name] / n_windows)
            s = scores(method, w, a, alpha)
            mask = make_mask(s, sparsity, nm)
            key = f"model.layers.{i}.{name}.weight"
            recon = None
            if needs_activations:
                x = inputs[name]
                recon = float(np.linalg.norm(x @ np.where(mask, w, 0.0).T) / np.linalg.norm(x @ w.T))
            result[key] = (mask, s, recon)
            pruned[name] = np.where(mask, 0.0, w)
        if needs_activations:
            h = model.block(i, h, weights=pruned)  # pruned pass -> next block's inputs
    return result


# ---- comparison ------------------------------------------------------------------------------------

def group_view(x, nm):
    """[m, n] -> [groups, group size]: rows (unstructured) or N:M groups."""
    if nm is None:
        return x
    m, n = x.shape
    return x.reshape(m * (n // nm[1]), nm[1])


def compare_masks(ref_mask, ref_scores, other_mask, nm=None, ignore=None, rtol=1e-6):
    """Disagreements between two masks of one matrix, each checked against the reference scores.

    Within a selection group (row or N:M group) let θ be the boundary: the largest reference score
    the reference pruned. A disagreement (an entry pruned by one side only) is a near-tie when its
    reference score is within rtol·θ of θ. `ignore`: entries excluded from the comparison (weights
    already zero in the dense model, which look pruned either way).
    Returns (number of disagreeing entries, number of them that are NOT near-ties, worst relative gap)."""
    rm, rs, om = group_view(ref_mask, nm), group_view(ref_scores, nm), group_view(other_mask, nm)
    diff = rm != om
    if ignore is not None:
        diff &= ~group_view(ignore, nm)
    count = int(diff.sum())
    if count == 0:
        return 0, 0, 0.0
    theta = np.where(rm, rs, -np.inf).max(axis=1, keepdims=True)
    gap = np.abs(rs - theta) / np.maximum(np.abs(theta), np.finfo(DTYPE).tiny)
    gaps = gap[diff]
    return count, int((gaps > rtol).sum()), float(gaps.max())
