"""Slow NumPy twins of the CPU kernels (float64 math), for the tests. Same arguments, but they
return their result instead of writing into a preallocated output."""

from __future__ import annotations

import numpy as np

from edge_infer.formats.quants import dequantize_blocks
from edge_infer.formats.quants_iq import e8m0_half, grid, iq1m_scale, sign_patterns
from edge_infer.formats.weight_types import weight_type


def decode_rows(w: np.ndarray, qtype: int) -> np.ndarray:
    """uint8 [R, row_bytes] -> float32 [R, K] with the reference dequantizer."""
    t = weight_type(qtype)
    k = w.shape[1] // t.type_size * t.block_size
    flat = dequantize_blocks(np.ascontiguousarray(w).reshape(-1), qtype, w.shape[0] * k)
    return flat.reshape(w.shape[0], k)


def matmul(x: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    return (x.astype(np.float64) @ decode_rows(w, qtype).astype(np.float64).T).astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    scale = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)
    return (x64 * scale * w).astype(np.float32)


def head_rmsnorm(x: np.ndarray, n_heads: int, head_dim: int, w: np.ndarray, eps: float) -> np.ndarray:
    t = x.reshape(x.shape[0], n_heads, head_dim)
    return rmsnorm(t, w, eps).reshape(x.shape)


def rope(x: np.ndarray, n_heads: int, head_dim: int, n_rot: int, positions: np.ndarray, inv_freq: np.ndarray,
         neox: bool, mscale: float = 1.0) -> np.ndarray:
    out = x.astype(np.float64).reshape(x.shape[0], n_heads, head_dim).copy()
    theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, n_rot/2]
    c, s = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    half = n_rot // 2
    if neox:
        a, b = out[..., :half].copy(), out[..., half:n_rot].copy()
        out[..., :half], out[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = out[..., 0:n_rot:2].copy(), out[..., 1:n_rot:2].copy()
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return out.reshape(x.shape).astype(np.float32)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    x = np.minimum(gate.astype(np.float64), 7.0)
    y = np.clip(up.astype(np.float64), -7.0, 7.0)
    return (x / (1.0 + np.exp(-1.702 * x)) * (y + 1.0)).astype(np.float32)


def relu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (np.maximum(gate.astype(np.float64), 0.0) * up).astype(np.float32)


def relu_sqr(x: np.ndarray) -> np.ndarray:
    return (np.maximum(x.astype(np.float64), 0.0) ** 2).astype(np.float32)


def xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    v = x.astype(np.float64)
    neg = (np.expm1(np.minimum(v, eps)) - v) * alpha_n + beta * v
    return np.where(v > 0, alpha_p * v * v + beta * v, neg).astype(np.float32)


def gelu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))) * up).astype(np.float32)


def cache_values(cache: np.ndarray, aux: np.ndarray | None = None) -> np.ndarray:
    """float64 values of a KV pool stored as f16 bits (uint16), float32, or rows of GGML blocks
    (uint8 [..., row bytes], aux int64 [1] their type) -> [..., head_dim]."""
    if aux is not None and aux.dtype == np.int64:
        rows = cache.reshape(-1, cache.shape[-1])
        return decode_rows(rows, int(aux[0])).astype(np.float64).reshape(*cache.shape[:-1], -1)
    if cache.dtype == np.uint16:
        return cache.view(np.float16).astype(np.float64)
    return cache.astype(np.float64)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, k_scale: np.ndarray, v_cache: np.ndarray,
                    v_scale: np.ndarray, block_tables: np.ndarray, token_seq: np.ndarray, positions: np.ndarray,
                    scale: float, window: int, softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Dense causal attention: gather each sequence's keys 0..p from its block table; sinks
    [n_heads]: a logit per head in the softmax with no value row (gpt-oss)."""
    vc = cache_values(v_cache, v_scale)
    n_kv, hd = v_cache.shape[2], vc.shape[3]
    bs = v_cache.shape[1]
    n_heads = q.shape[1] // hd
    rep = n_heads // n_kv
    # a float K pool's blocks are [head, dim, offset]: back to V's [offset, head, dim]
    kc = cache_values(k_cache, k_scale) if k_scale.dtype == np.int64 else cache_values(k_cache.transpose(0, 3, 1, 2))
    out = np.zeros((q.shape[0], n_heads * hd), np.float64)
    for i in range(q.shape[0]):
        p = int(positions[i])
        lo = max(0, p - window + 1) if window > 0 else 0
        js = np.arange(lo, p + 1)
        blocks = block_tables[token_seq[i], js // bs]
        keys, vals = kc[blocks, js % bs], vc[blocks, js % bs]  # [n, n_kv, hd]
        for h in range(n_heads):
            g = h // rep
            s = keys[:, g, :] @ q[i, h * hd : (h + 1) * hd].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            mx = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            e = np.exp(s - mx)
            den = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - mx))
            out[i, h * hd : (h + 1) * hd] = (e / den) @ vals[:, g, :]
    return out.astype(np.float32)


def i8_codes(w: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """The integer view of a matrix of a type with an int8 form (formats.weight_types) the
    int8 kernel computes with: u8 codes int64 [R, nb, 32] in column order, scales d float32
    [R, nb], mins m float32 [R, nb] (forms with a min) or None, and the code of zero (weight =
    d * (code - offset) [+ m]; signed codes count from 128)."""
    t = weight_type(qtype)
    form = t.i8
    assert form is not None, f"{t.name} has no int8 form"
    rows = w.shape[0]
    blk = w.reshape(rows, -1, t.type_size)

    def half(field: str) -> np.ndarray:
        at = t.offset(field)
        return blk[:, :, at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    if form.zero is None and form.table is None:  # signed 8-bit codes
        return blk[:, :, t.offset("qs") :].view(np.int8).astype(np.int64) + 128, half("d"), None, 128
    qs = blk[:, :, t.offset("qs") :].astype(np.int64)
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)
    if form.table is not None:  # 4-bit codes standing for the table's signed values
        if "e" in (t.dtype.names or ()):  # MXFP4: the E8M0 scale 2^(e - 128)
            d = e8m0_half(blk[:, :, t.offset("e")])
        else:
            d = half("d")
        return np.array(form.table, np.int64)[codes] + 128, d, None, 128
    if form.fifth_bit:
        at = t.offset("qh")
        qh = blk[:, :, at : at + 4].copy().view(np.uint32)[..., 0].astype(np.int64)
        codes = codes | (((qh[..., None] >> np.arange(32)) & 1) << 4)
    assert form.zero is not None  # unsigned codes: the signed ones returned above
    return codes, half("d"), half("m") if form.has_min else None, form.zero


def matmul_i8(xq: np.ndarray, xd: np.ndarray, xsum: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    """The int8 kernel's exact arithmetic: xq int8 [T, K], xd float32 [T, nb], xsum int32
    [T, nb] (quantized activations) times w -> float32 [T, R]; per block in order, exact integer
    sums, then acc += float32(isum - offset * xsum) * (d * dx) [+ m * (dx * xsum)]."""
    codes, d, m, offset = i8_codes(w, qtype)
    acc = np.zeros((xq.shape[0], w.shape[0]), np.float32)
    for b in range(codes.shape[1]):
        isum = xq[:, b * 32 : (b + 1) * 32].astype(np.int64) @ codes[:, b, :].T - offset * xsum[:, b : b + 1]
        dx = xd[:, b : b + 1]
        term = isum.astype(np.float32) * (d[None, :, b] * dx)
        if m is not None:
            term = term + m[None, :, b] * (dx * xsum[:, b : b + 1].astype(np.float32))
        acc = acc + term
    return acc


def _grid_codes(blk: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
    """A grid type's blocks uint8 [R, S, type_size] -> (signed grid values int64 [R, S * 256] in
    column order, 4-bit scales s int64 [R, S, 8 or 16])."""
    t = weight_type(qtype)
    assert t.k is not None and t.k.grid is not None
    g = t.k.grid
    rows, n = blk.shape[0], blk.shape[1]

    def u(lo: int, hi: int, dtype: str = "u1") -> np.ndarray:
        return np.ascontiguousarray(blk[:, :, lo:hi]).view(dtype).astype(np.int64)

    def seven(sign7: np.ndarray) -> np.ndarray:  # [..., groups] 7 sign bits -> [..., groups * 8] negative
        return (sign_patterns()[sign7] < 0).reshape(*sign7.shape[:-1], -1)

    def eight(b: np.ndarray) -> np.ndarray:
        return (((b[..., None] >> np.arange(8)) & 1) == 1).reshape(*b.shape[:-1], -1)

    def nibbles(b: np.ndarray) -> np.ndarray:
        return np.stack([b & 15, b >> 4], axis=-1).reshape(rows, n, -1)

    neg = np.zeros((rows, n, 256), bool)
    if t.name == "IQ1_S":  # per 32 columns a u16: 4 x 3 high index bits, a 3-bit scale, the delta's sign
        qh = u(34, 50, "<u2")
        idx = (u(2, 34).reshape(rows, n, 8, 4) | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
               | ((qh[..., None] >> 15) << 11)).reshape(rows, n, 32)
        sc = (qh >> 12) & 7
    elif t.name == "IQ1_M":  # a nibble of qh per 8 columns (3 index bits, the delta's sign), 3-bit scales per 16
        h = (u(32, 48)[..., None] >> np.array([0, 4])).reshape(rows, n, 32)
        idx = u(0, 32) | ((h & 7) << 8) | (((h >> 3) & 1) << 11)
        sc = (u(48, 56, "<u2")[..., None] >> (3 * np.arange(4))).reshape(rows, n, 16) & 7
    elif t.name in ("IQ2_XXS", "IQ3_XXS"):
        if t.name == "IQ2_XXS":
            q = u(2, 66).reshape(rows, n, 8, 8)
            idx = q[..., :4].reshape(rows, n, 32)
            aux = np.ascontiguousarray(blk[:, :, 2:66]).view("<u4").astype(np.int64).reshape(rows, n, 8, 2)[..., 1]
        else:
            idx, aux = u(2, 66), u(66, 98, "<u4")
        sc = aux >> 28
        neg = seven(((aux[..., None] >> (7 * np.arange(4))) & 127).reshape(rows, n, 32))
    elif t.name == "IQ2_XS":
        q = u(2, 66, "<u2")
        idx, neg, sc = q & 511, seven(q >> 9), nibbles(u(66, 74))
    elif t.name == "IQ2_S":
        qh = u(66, 74)
        gi = np.arange(32)
        idx = u(2, 34) | ((qh[..., gi // 4] << (8 - 2 * (gi % 4))) & 0x300)
        neg, sc = eight(u(34, 66)), nibbles(u(74, 82))
    else:  # IQ3_S
        k = np.arange(64)
        idx = u(2, 66) | (((u(66, 74)[..., k // 8] >> (k % 8)) & 1) << 8)
        neg, sc = eight(u(74, 106)), nibbles(u(106, 110))
    values = grid(g.name).astype(np.int64)[idx].reshape(rows, n, 256)
    return np.where(neg, -values, values).reshape(rows, -1), sc


def k_codes(w: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """The integer view of a matrix of a type with a K-quant form (Q4_K, Q5_K, Q6_K; from its
    GGUF bytes) the K-quant kernel computes with: unsigned codes int64 [R, K] in column order,
    sub-block scales int64 [R, S, 8] (Q6_K: [R, S, 16], signed), mins int64 [R, S, 8] or None, d
    and dmin float32 [R, S] (dmin None for Q6_K, IQ4_XS). Weight = d * sc * code - dmin * m (Q4_K,
    Q5_K), d * sc * (code - 32) (Q6_K), d * sc * (code - 128) (IQ4_XS: codes are its table's
    values + 128, sc = the 6-bit scale - 32), d * (code - 1) (TQ1_0, TQ2_0: sc = 1); the grid
    types as IQ4_XS with their signed grid values, sc = 2s + 1 (per 16 columns: IQ2_XS, IQ2_S)
    and d times the type's factor."""
    t = weight_type(qtype)
    assert t.k is not None, f"{t.name} has no K-quant form"
    rows = w.shape[0]
    blk = w.reshape(rows, -1, t.type_size)

    def field(name: str, size: int) -> np.ndarray:
        return blk[:, :, t.offset(name) : t.offset(name) + size]

    def f16(name: str) -> np.ndarray:
        return field(name, 2).copy().view(np.float16)[..., 0].astype(np.float32)

    if t.k.grid is not None:
        values, s = _grid_codes(blk, qtype)
        if "d" in (t.dtype.names or ()):
            d = f16("d")
        else:  # IQ1_M: the f16 in the top 4 bits of each of its 4 scale words
            d = iq1m_scale(field("scales", 8).copy().view("<u2")).astype(np.float32)
        return values + 128, 2 * s + 1, None, d * np.float32(t.k.grid.d_factor), None
    if t.k.bits == 2:  # TQ1_0, TQ2_0: the ternary digits t (weight d * (t - 1)), sc = 1
        if "qh" in (t.dtype.names or ()):  # TQ1_0: digit n of byte v = ((v * 3^n) & 255) * 3 >> 8
            def digits(v: np.ndarray, n: int) -> np.ndarray:
                p3 = 3 ** np.arange(n, dtype=np.int64)[:, None]
                return (((v[..., None, :] * p3) & 255) * 3) >> 8  # [R, S, n, bytes]

            qs, qh = field("qs", 48).astype(np.int64), field("qh", 4).astype(np.int64)
            parts = [digits(qs[..., :32], 5), digits(qs[..., 32:], 5), digits(qh, 4)]
            codes = np.concatenate([p.reshape(rows, -1, p.shape[-1] * p.shape[-2]) for p in parts], -1)
        else:  # TQ2_0: column 128j + 32l + m in bits 2l of qs[32j + m]
            qs = field("qs", 64).astype(np.int64).reshape(rows, -1, 2, 1, 32)
            codes = (qs >> (2 * np.arange(4))[:, None]) & 3
        return codes.reshape(rows, -1), np.ones((rows, blk.shape[1], 8), np.int64), None, f16("d"), None
    if t.k.table is not None:  # IQ4_XS
        sh = field("scales_h", 2).copy().view(np.uint16)[..., 0].astype(np.int64)
        sl = field("scales_l", 4).astype(np.int64)
        ib = np.arange(8)
        sc = ((sl[..., ib // 2] >> (4 * (ib % 2))) & 15) | (((sh[..., None] >> (2 * ib)) & 3) << 4)
        qs = field("qs", 128).astype(np.int64).reshape(rows, -1, 8, 16)
        nib = np.concatenate([qs & 15, qs >> 4], axis=-1)  # [R, S, 8, 32] in column order
        return np.array(t.k.table, np.int64)[nib].reshape(rows, -1) + 128, sc - 32, None, f16("d"), None
    if t.k.has_min:
        q = field("scales", 12).astype(np.int64)
        sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], -1)
        mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], -1)
        qs = field("qs", 128).astype(np.int64).reshape(rows, -1, 4, 32)
        codes = np.stack([qs & 15, qs >> 4], axis=3)  # [R, S, 4 chunks, 2 halves, 32]
        if t.k.bits == 5:
            qh = field("qh", 32).astype(np.int64)[:, :, None, None, :]
            shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :])[None, None, :, :, None]
            codes = codes | (((qh >> shift) & 1) << 4)
        return codes.reshape(rows, -1), sc, mn, f16("d"), f16("dmin")
    ql = field("ql", 128).astype(np.int64).reshape(rows, -1, 2, 2, 32)  # [R, S, n, lo/lo2, 32]
    qh = field("qh", 64).astype(np.int64).reshape(rows, -1, 2, 1, 32)
    low = (ql & 15) | (((qh >> (2 * np.arange(2)[:, None])) & 3) << 4)  # columns 128n + 32i + j, i = 0, 1
    high = (ql >> 4) | (((qh >> (4 + 2 * np.arange(2)[:, None])) & 3) << 4)  # i = 2, 3
    codes = np.concatenate([low, high], axis=3).reshape(rows, -1)
    sc = field("scales", 16).copy().view(np.int8).astype(np.int64)
    return codes, sc, None, f16("d"), None


def quantize_q8_16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [T, K] -> (int8 codes [T, K], scales float32 [T, K/32], sums int64 [T, K/16]),
    as kernels_cpu.matmul_i8.quantize_rows_q8 with sums per 16 (float32 math, round half to even)."""
    t, k = x.shape
    blocks = x.reshape(t, -1, 32)
    d = (np.abs(blocks).max(-1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(d == 0, np.float32(1.0), d)
    inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / safe).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8).reshape(t, k)
    return q, d, q.astype(np.int64).reshape(t, -1, 16).sum(-1)


def matmul_k(xq: np.ndarray, xd: np.ndarray, xs16: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    """The K-quant kernel's exact arithmetic (kernels_cpu.matmul_k): per 32-column block in
    order, exact integer sums, then Q4_K / Q5_K: acc += float32(isum) * ((d * sc) * dx) +
    (-(dmin * m)) * (dx * float32(xsum)); Q6_K: acc += float32(isum) * (d * dx), isum combining
    the two 16-column halves with their scales in integers; IQ4_XS: acc += float32(isum - 128 *
    xsum) * ((d * sc) * dx); TQ1_0 / TQ2_0 the same with 1 for 128 and sc = 1; the grid types
    as IQ4_XS, or per 16 columns (IQ2_XS, IQ2_S) as Q6_K with 128 for 32."""
    codes, sc, mn, d, dmin = k_codes(w, qtype)
    form = weight_type(qtype).k
    assert form is not None
    per16 = form.grid is not None and form.grid.scale_cols == 16
    table = form.table is not None or (form.grid is not None and not per16)
    ternary = form.bits == 2
    rows = d.shape[0]
    acc = np.zeros((xq.shape[0], rows), np.float32)
    x64 = xq.astype(np.int64)
    for blk in range(codes.shape[1] // 32):
        s, j = divmod(blk, 8)
        dx = xd[:, blk : blk + 1]
        lo, hi = xs16[:, 2 * blk : 2 * blk + 1], xs16[:, 2 * blk + 1 : 2 * blk + 2]
        if table or ternary:  # codes less 128 (the table's values) or 1 (the digits)
            c = slice(blk * 32, blk * 32 + 32)
            isum = x64[:, c] @ codes[:, c].T - (128 if table else 1) * (lo + hi)
            ds = sc[:, s, j].astype(np.float32) * d[:, s]
            acc = acc + isum.astype(np.float32) * (ds[None, :] * dx)
        elif mn is None:
            c = slice(blk * 32, blk * 32 + 16)
            c2 = slice(blk * 32 + 16, blk * 32 + 32)
            off = 128 if per16 else 32
            isum = (x64[:, c] @ codes[:, c].T - off * lo) * sc[None, :, s, 2 * j]
            isum = isum + (x64[:, c2] @ codes[:, c2].T - off * hi) * sc[None, :, s, 2 * j + 1]
            acc = acc + isum.astype(np.float32) * (d[None, :, s] * dx)
        else:
            assert dmin is not None  # Q4_K/Q5_K: k_codes gives dmin with the mins
            c = slice(blk * 32, blk * 32 + 32)
            isum = x64[:, c] @ codes[:, c].T
            ds = sc[:, s, j].astype(np.float32) * d[:, s]
            ms = mn[:, s, j].astype(np.float32) * -dmin[:, s]
            acc = acc + (isum.astype(np.float32) * (ds[None, :] * dx) + ms[None, :] * (dx * (lo + hi).astype(np.float32)))
    return acc


def route(logits: np.ndarray, k: int, norm: bool, gating: int = 0,
          bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Twin of moe.route_kernel's choice: softmax (gating 0), sigmoid (1) or the logits (2) of
    each row of logits [N, E], the k largest of that + bias [E] (descending, ties to the lower
    expert), their probabilities (gating 2: a softmax over the chosen logits), divided by their
    sum when norm (clamped below at 2^-14). Returns (experts i32 [N, k], weights f32 [N, k])."""
    if gating == 2:
        p = logits.astype(np.float64)
    elif gating == 1:
        p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    else:
        z = np.exp((logits - logits.max(axis=1, keepdims=True)).astype(np.float64))
        p = z / z.sum(axis=1, keepdims=True)
    score = p if bias is None else p + bias[None, :]
    sel = np.argsort(-score, axis=1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, sel, axis=1)
    if gating == 2:
        w = np.exp(w - w[:, :1])
        w = w / w.sum(axis=1, keepdims=True)
    if norm:
        w = w / np.maximum(w.sum(axis=1, keepdims=True), 2.0**-14)
    return sel, w.astype(np.float32)


def lora_add(x: np.ndarray, row_ptr: np.ndarray, ent_adapter: np.ndarray, ent_scale: np.ndarray, tab_off: np.ndarray,
             tab_rank: np.ndarray, tab_alpha: np.ndarray, a: np.ndarray, bt: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out plus each row's LoRA updates scale * B (A x[t]) (kernels_cpu/lora.py's layout; a, bt
    float32 or uint16 half bits), in float64."""
    res = out.astype(np.float64)
    a64 = (a.view(np.float16) if a.dtype == np.uint16 else a).astype(np.float64)
    bt64 = (bt.view(np.float16) if bt.dtype == np.uint16 else bt).astype(np.float64)
    for t in range(x.shape[0]):
        for e in range(row_ptr[t], row_ptr[t + 1]):
            i = ent_adapter[e]
            rank = tab_rank[i]
            if rank == 0:
                continue
            scale = float(ent_scale[e]) * (float(tab_alpha[i]) / rank if tab_alpha[i] else 1.0)
            rows = slice(tab_off[i], tab_off[i] + rank)
            res[t] += scale * (bt64[rows].T @ (a64[rows] @ x[t].astype(np.float64)))
    return res.astype(np.float32)
