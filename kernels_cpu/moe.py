"""Mixture-of-experts routing and combination (the grouped expert matmuls are matmul_experts.py).

A step's N tokens each pick k of E experts; the (token, expert) pairs are numbered P = N * k,
grouped by expert (counting sort: expert order, then token order), so each expert's pairs are
one contiguous range [offsets[e], offsets[e + 1]) of every pair-major buffer and its weights
are read once for all of them. Every per-token result (probabilities, choice, weights, the
weighted sum) is computed in a fixed order from that token's own inputs: batch invariance holds.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._jit import REORDER, fmadd, kernel

# llama.cpp clamps the sum of the chosen weights before normalising (the smallest normal f16)
MIN_WEIGHT_SUM = np.float32(6.103515625e-5)
SERIAL_PAIRS = 64  # below this many pairs the gather runs on the calling thread
SOFTMAX, SIGMOID, SOFTMAX_WEIGHT = 0, 1, 2  # route_kernel's gating (llama.cpp's expert_gating_func, less one)


@kernel(inline=True)
def _route_token(logits, t, k, norm, gating, bias, sel, wts, probs, taken):
    """The token's E router probabilities: softmax (float64 sum in index order), each logit's
    sigmoid (gating SIGMOID), or the logits themselves (SOFTMAX_WEIGHT, gpt-oss: the k chosen
    weighted by a softmax over their logits); the k largest in descending order (ties: the
    lower expert id), ranked by probability + bias[e] when a selection bias is given (bias [0]:
    none), weighted by the unbiased probability, divided by the weights' sum when norm."""
    E = logits.shape[1]
    if gating == SOFTMAX_WEIGHT:
        for e in range(E):
            probs[e] = logits[t, e]
    elif gating == SIGMOID:
        for e in range(E):
            probs[e] = np.float32(1.0 / (1.0 + math.exp(-logits[t, e])))
    else:
        m = logits[t, 0]
        for e in range(1, E):
            m = max(m, logits[t, e])
        s = 0.0
        for e in range(E):
            p = np.float32(math.exp(logits[t, e] - m))
            probs[e] = p
            s += p
        inv = np.float32(1.0 / s)
        for e in range(E):
            probs[e] = probs[e] * inv
    biased = bias.shape[0] > 0
    for e in range(E):
        taken[e] = False
    total = np.float32(0.0)
    for j in range(k):
        best = -1
        best_score = np.float32(0.0)
        for e in range(E):
            score = probs[e] + bias[e] if biased else probs[e]
            if not taken[e] and (best < 0 or score > best_score):
                best, best_score = e, score
        taken[best] = True
        sel[t, j] = best
        wts[t, j] = probs[best]
        total += probs[best]
    if gating == SOFTMAX_WEIGHT:  # a softmax over the chosen logits (the first, the largest, is its max)
        m = wts[t, 0]
        s = 0.0
        for j in range(k):
            p = np.float32(math.exp(wts[t, j] - m))
            wts[t, j] = p
            s += p
        inv = np.float32(1.0 / s)
        total = np.float32(0.0)
        for j in range(k):
            wts[t, j] = wts[t, j] * inv
            total += wts[t, j]
    if norm:
        total = max(total, MIN_WEIGHT_SUM)
        for j in range(k):
            wts[t, j] = wts[t, j] / total


@kernel(fastmath=REORDER)
def _router_logits(x, router, logits, t):
    """logits[t, e] = x[t] . router[e] (float32; REORDER lets LLVM vectorize each reduction,
    one fixed order for every token)."""
    for e in range(router.shape[0]):
        s = np.float32(0.0)
        for d in range(x.shape[1]):
            s = fmadd(x[t, d], router[e, d], s)
        logits[t, e] = s


SERIAL_TOKENS = 8  # below this many tokens routing runs on the calling thread


@kernel(parallel=True)
def route_kernel(logits, router, norm, gating, bias, x, sel, wts, offsets, pair_token, pair_of, xg):
    """logits f32 [N, E] router logits, computed here from router f32 [E, D] (an F32 router
    matrix) or given (router [0, D]: another type, multiplied by the caller); norm: divide the
    chosen weights by their sum; gating: SOFTMAX, SIGMOID or SOFTMAX_WEIGHT (_route_token); bias f32
    [E] added to the probabilities for the choice only ([0]: none); x f32 [N, D] the FFN input. Writes sel i32 [N, k] the chosen
    experts (descending probability), wts f32 [N, k] their weights, offsets i32 [E + 1] each
    expert's pair range, pair_token i32 [P] the token of each pair, pair_of i32 [N, k] the pair
    of (token, choice j), and xg f32 [P, D] = x[pair_token] (the experts' gathered input)."""
    N, E = logits.shape
    k = sel.shape[1]
    given = router.shape[0] == 0
    if N < SERIAL_TOKENS:
        probs = np.empty(E, np.float32)
        taken = np.empty(E, np.bool_)
        for t in range(N):
            if not given:
                _router_logits(x, router, logits, t)
            _route_token(logits, t, k, norm, gating, bias, sel, wts, probs, taken)
    else:
        for t in numba.prange(N):
            probs = np.empty(E, np.float32)
            taken = np.empty(E, np.bool_)
            if not given:
                _router_logits(x, router, logits, t)
            _route_token(logits, t, k, norm, gating, bias, sel, wts, probs, taken)
    for e in range(E + 1):
        offsets[e] = 0
    for t in range(N):
        for j in range(k):
            offsets[sel[t, j] + 1] += 1
    for e in range(E):
        offsets[e + 1] += offsets[e]
    fill = offsets[:E].copy()
    for t in range(N):  # token order within each expert
        for j in range(k):
            e = sel[t, j]
            pair_token[fill[e]] = t
            pair_of[t, j] = fill[e]
            fill[e] += 1
    P = N * k
    if P < SERIAL_PAIRS:
        for p in range(P):
            xg[p] = x[pair_token[p]]
    else:
        for p in numba.prange(P):
            xg[p] = x[pair_token[p]]


@kernel(inline=True)
def _combine_row(y, pair_of, wts, out, t):
    # choice order, as llama.cpp adds the weighted experts; one row at a time (contiguous)
    w, r = wts[t, 0], pair_of[t, 0]
    for d in range(out.shape[1]):
        out[t, d] = w * y[r, d]
    for j in range(1, pair_of.shape[1]):
        w, r = wts[t, j], pair_of[t, j]
        for d in range(out.shape[1]):
            out[t, d] += w * y[r, d]


@kernel(parallel=True)
def combine_kernel(y, pair_of, wts, out):
    """out[t] = sum over j of wts[t, j] * y[pair_of[t, j]]: y f32 [P, D] the experts' outputs,
    out f32 [N, D]."""
    N = out.shape[0]
    if N * pair_of.shape[1] < SERIAL_PAIRS:
        for t in range(N):
            _combine_row(y, pair_of, wts, out, t)
    else:
        for t in numba.prange(N):
            _combine_row(y, pair_of, wts, out, t)


@kernel(parallel=True)
def gated_add_kernel(x, g, y, out):
    """out[t] += sigmoid(x[t] . g) * y[t] (qwen2moe's gated shared expert): x, y, out f32
    [N, D], g f32 [D]; the dot product in float64, index order."""
    for t in numba.prange(out.shape[0]):
        s = 0.0
        for d in range(x.shape[1]):
            s += np.float64(x[t, d]) * np.float64(g[d])
        gate = np.float32(1.0 / (1.0 + math.exp(-s)))
        for d in range(out.shape[1]):
            out[t, d] += gate * y[t, d]


@kernel
def expert_scale_kernel(wts, sel, scale):
    """wts f32 [T, k] *= scale f32 [E] of each choice's expert sel i32 [T, k] (gemma4's per-expert
    output scale, folded into the weight its output is summed with)."""
    for t in range(wts.shape[0]):
        for j in range(wts.shape[1]):
            wts[t, j] *= scale[sel[t, j]]


@kernel(parallel=True)
def expert_bias_kernel(y, bias, offsets):
    """y f32 [P, F] += bias f32 [E, F] of each pair's expert (expert e's pairs: rows
    offsets[e]..offsets[e + 1] - 1)."""
    for e in numba.prange(bias.shape[0]):
        for p in range(offsets[e], offsets[e + 1]):
            for f in range(y.shape[1]):
                y[p, f] += bias[e, f]
