"""An independent numpy implementation of DSnoT (reference-implementations.md §5.2 unstructured, §5.3
N:M) and of the R²-DSnoT keys (DESIGN.md §3.4), for the parity test test_refine_reference.py.

It follows the reference code's structure: keys once per matrix from the initial mask, then a lock-step
cycle loop over all rows with per-row pointers into the regrow list A_r and the prune list B_r. Where the
reference's behaviour is undefined or degenerate, it applies the rules symprune documents in
src/core/refine_dsnot.h, and counts how often each one fired (`RefineTrace`):
  * a row whose |e| <= τ (or, with the sign test, whose swap would flip the sign of e) freezes and is
    never touched again (the reference keeps advancing its pointers; its writes are no-ops for realistic n);
  * a regrow pointer on a NaN key passes over it; with γ₁ > 0 the two directions have their own orders
    and an entry already regrown through the other one is passed over;
  * the row stops when a pointer runs off its list, lands on an entry that is not currently pruned
    (regrow) / kept (prune), or on a weight whose D has the wrong sign for e (the paper's Δ < 0);
  * the prune list keeps D == 0 columns with the negatives (the reference's helper drops them).
Numerics as symprune: D = W·μ̃, the regrow and prune keys are rounded to float32 (D in float32, as the
reference), e is accumulated in float64; sorts are stable ascending with NaN last (numpy = torch order).
"""
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32


@dataclass
class Options:
    max_cycles: int = 50
    threshold: float = 0.1
    var_power: float = 1.0
    same_sign: bool = False
    r2: bool = False
    grow_relative: bool = True
    prune_relative: bool = True
    reg_p: float = 2.0
    gamma_grow: float = 0.0
    gamma_prune: float = 0.0
    alpha: float = 0.5
    nm_prune_any_sign: bool = False  # --compat dsnot: the code's N:M prune pick, whatever D's sign


@dataclass
class RefineTrace:
    swaps: int = 0
    stops: dict = field(default_factory=dict)  # rule -> rows stopped by it

    def stop(self, rule):
        self.stops[rule] = self.stops.get(rule, 0) + 1


def _norm_with(kept_abs, x, p):
    """‖W̃_r + x e_c‖_p for a pruned c (x = |W[r,c]|), kept_abs = |W̃_r| over the kept entries."""
    if p == 1:
        return kept_abs.sum() + x
    if p == 2:
        return np.sqrt((kept_abs ** 2).sum() + x * x)
    return np.maximum(kept_abs.max(initial=0.0), x)


def _norm_without(kept_abs_full, c, p):
    """‖W̃_r − W[r,c] e_c‖_p for a kept c: the norm of the kept entries with c removed (recomputed)."""
    rest = np.delete(kept_abs_full, c)
    if p == 1:
        return rest.sum()
    if p == 2:
        return np.sqrt((rest ** 2).sum())
    return rest.max(initial=0.0)


def keys(w, mu, var, act, mask, opt):
    """Per-matrix keys: D [m,n] (f32), regrow keys up/down [m,n] (f32), prune key [m,n] (f32)."""
    w32 = w.astype(F32)
    d = w32 * mu.astype(F32)[None, :]
    v32 = var.astype(F32)
    v_pow = v32 if opt.var_power == 1.0 else np.power(v32, F32(opt.var_power))
    m, n = w.shape
    if not opt.r2:
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(mask, d, F32(0.0))
            if opt.var_power != 0.0:
                g = (g / v_pow[None, :]).astype(F32)
        wanda = (np.abs(w) * act[None, :]).astype(F32)
        return d, g, g, wanda
    kept_abs = np.where(mask, 0.0, np.abs(w))  # |W̃|
    row_l1 = kept_abs.sum(axis=1)
    col_l1 = kept_abs.sum(axis=0)
    with np.errstate(divide="ignore"):
        row_inv = np.where(row_l1 > 0, 1.0 / row_l1, 0.0)
        col_inv = np.where(col_l1 > 0, 1.0 / col_l1, 0.0)
    relative = row_inv[:, None] + col_inv[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(mask, d.astype(np.float64) * (relative if opt.grow_relative else 1.0), 0.0)
        if opt.var_power != 0.0:
            g = g / v_pow.astype(np.float64)[None, :]
    up, down = g.copy(), g.copy()
    if opt.gamma_grow > 0:
        for r in range(m):
            for c in np.flatnonzero(mask[r]):
                reg = opt.gamma_grow * _norm_with(kept_abs[r][~mask[r]], abs(w[r, c]), opt.reg_p)
                up[r, c] = g[r, c] - reg
                down[r, c] = g[r, c] + reg
    act_pow = act if opt.alpha == 1.0 else act ** opt.alpha
    prune = np.abs(w) * (relative if opt.prune_relative else 1.0) * act_pow[None, :]
    if opt.gamma_prune > 0:
        for r in range(m):
            for c in np.flatnonzero(~mask[r]):
                prune[r, c] += opt.gamma_prune * _norm_without(kept_abs[r], c, opt.reg_p)
    return d, up.astype(F32), down.astype(F32), prune.astype(F32)


def refine(w, mu, var, act, mask, opt, nm=None, initial_scores=None):
    """Refined copy of `mask` (True = pruned) for W [m, n]; nm = (N, M) for §5.3. Returns (mask, trace).
    initial_scores: S_init, the key of the N:M prune pick in the reference code (§5.3; default: the Wanda
    score, as the unstructured prune list)."""
    m, n = w.shape
    init = mask.copy()
    mask = mask.copy()
    d, g_up, g_down, pk = keys(w, mu, var, act, init, opt)
    nm_pk = initial_scores.astype(F32) if initial_scores is not None and not opt.r2 else pk
    two_orders = opt.r2 and opt.gamma_grow > 0
    # Regrow lists A_r: stable ascending argsort (NaN last) of the key over all n columns.
    a_up = np.argsort(g_up, axis=1, kind="stable")
    a_down = np.argsort(g_down, axis=1, kind="stable") if two_orders else a_up
    # Prune lists B_r: kept columns by ascending prune key; D <= 0 in that order, then D > 0 reversed.
    b = []
    for r in range(m):
        kept = np.flatnonzero(~init[r])
        kept = kept[np.argsort(pk[r, kept], kind="stable")]
        positive = d[r, kept] > 0
        b.append(np.concatenate([kept[~positive], kept[positive][::-1]]))
    d64 = d.astype(np.float64)
    e = np.array([d64[r, init[r]].sum() for r in range(m)])  # order differs from C++ only in the last bits
    e0 = np.sign(e)
    same_sign = opt.same_sign or nm is not None
    a0 = np.zeros(m, dtype=np.int64)
    a1 = np.full(m, n - 1, dtype=np.int64)
    b0 = np.zeros(m, dtype=np.int64)
    b1 = np.array([len(x) - 1 for x in b], dtype=np.int64)
    active = np.ones(m, dtype=bool)
    touched = init.copy()  # N:M: S' = +inf on initially pruned entries and every prune pick
    trace = RefineTrace()

    def stop(r, rule):
        active[r] = False
        trace.stop(rule)

    for _cycle in range(opt.max_cycles):
        if not active.any():
            break
        for r in range(m):
            if not active[r]:
                continue
            if not abs(e[r]) > opt.threshold:
                stop(r, "threshold")
                continue
            # Regrow pick.
            g = None
            while True:
                if e[r] > 0:
                    gi, a1[r] = a1[r], a1[r] - 1
                else:
                    gi, a0[r] = a0[r], a0[r] + 1
                if gi < 0 or gi >= n:
                    break
                cand = (a_down if e[r] > 0 else a_up)[r, gi]
                if np.isnan(g_up[r, cand]) or (two_orders and init[r, cand] and not mask[r, cand]):
                    continue
                g = cand
                break
            if g is None:
                stop(r, "regrow list exhausted")
                continue
            if not (d[r, g] > 0 if e[r] > 0 else d[r, g] < 0):
                stop(r, "regrow sign")
                continue
            if not mask[r, g]:
                stop(r, "not a swap")
                continue
            # Prune pick.
            if nm is not None:
                start = g - g % nm[1]
                block = np.arange(start, start + nm[1])
                free = block[~touched[r, block]]
                # Only those that move e towards 0, as in the unstructured lists (the code: any sign).
                if not opt.nm_prune_any_sign:
                    free = free[d[r, free] > 0] if e[r] < 0 else free[~(d[r, free] > 0)]
                if free.size == 0:
                    if opt.nm_prune_any_sign:
                        stop(r, "N:M block exhausted")
                    # else: this g is ruled out; the cycle is spent and the next one tries the next g.
                    continue
                p = free[np.argsort(nm_pk[r, free], kind="stable")[0]]
            else:
                if e[r] < 0:
                    pi, b1[r] = b1[r], b1[r] - 1
                else:
                    pi, b0[r] = b0[r], b0[r] + 1
                if pi < 0 or pi >= len(b[r]):
                    stop(r, "prune list exhausted")
                    continue
                p = b[r][pi]
                if (d[r, p] <= 0) if e[r] < 0 else (d[r, p] > 0):
                    stop(r, "prune sign")
                    continue
            if mask[r, p]:
                stop(r, "not a swap")
                continue
            e_after = e[r] + d64[r, p] - d64[r, g]
            if same_sign and np.sign(e_after) != e0[r]:
                stop(r, "sign flip")
                continue
            touched[r, p] = True
            mask[r, p] = True
            mask[r, g] = False
            e[r] = e_after
            trace.swaps += 1
    return mask, trace
