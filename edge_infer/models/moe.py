"""The mixture-of-experts FFN, beside the dense block of transformer.py: a router picks each
token's experts (softmax over the router logits, or lfm2moe's sigmoid ranked with a selection
bias; top k, weights normalised when the architecture says), every chosen expert's SwiGLU runs on the tokens routed to it (one read of
its weights per step, kernels_cpu.matmul_experts), and their outputs are summed with the
weights in choice order; qwen2moe adds a shared expert gated per token by a sigmoid, granite
(granitehybrid) one without a gate."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import LayerWeights

GATINGS = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}  # the backend's route_experts codes


def moe_ffn(b: Backend, cfg: ModelConfig, lw: LayerWeights, x: np.ndarray, out: np.ndarray, ws: Any,
            logits: np.ndarray | None = None) -> None:
    """out f32 [N, D] = the layer's FFN of x f32 [N, D]; scratch is ws.moe (and the dense
    buffers for a shared expert); logits [N, E]: the router's output computed already."""
    e, m = lw.experts, ws.moe
    assert e is not None
    n = x.shape[0]
    p = n * cfg.n_experts_used
    if logits is None and e.router_bias is not None:  # gpt-oss: the router's bias
        logits = ws.moe.logits[:n]
        b.matmuls(x, (e.router,), (logits,), ws)
        b.add(logits, e.router_bias)
    b.route_experts(e.router, x, cfg.expert_weights_norm, ws, GATINGS[cfg.expert_gating], e.select_bias, logits)
    gate, up, act, y = m.gate[:p], m.up[:p], m.act[:p], m.y[:p]
    b.expert_matmuls(m.xg[:p], (e.gate, e.up), (gate, up), ws)
    if e.gate_bias is not None and e.up_bias is not None:  # gpt-oss
        b.expert_bias(gate, e.gate_bias, ws)
        b.expert_bias(up, e.up_bias, ws)
    activation = {"relu": b.relu_mul, "swiglu_oai": b.swiglu_oai, "gelu": b.gelu_mul}.get(cfg.expert_activation,
                                                                                         b.silu_mul)
    activation(gate, up, act)
    b.expert_matmuls(act, (e.down,), (y,), ws)
    if e.down_bias is not None:
        b.expert_bias(y, e.down_bias, ws)
    b.combine_experts(y, out, ws)
    if lw.w_gate is not None and lw.w_up is not None and lw.w_down is not None:  # a shared expert
        fs = lw.w_gate.rows  # the buffers may be wider (a leading dense layer's FFN)
        sg, su, sa, sy = ws.gate[:n, :fs], ws.up[:n, :fs], ws.act[:n, :fs], ws.o2[:n]
        b.matmuls(x, (lw.w_gate, lw.w_up), (sg, su), ws)
        b.silu_mul(sg, su, sa)
        b.matmuls(sa, (lw.w_down,), (sy,), ws)
        if e.shared_gate is not None:
            b.gated_add(x, e.shared_gate, sy, out)
        else:
            b.add(out, sy)


def moe_beside_dense(b: Backend, cfg: ModelConfig, lw: LayerWeights, h: Any, x: Any, out: Any, ws: Any) -> Any:
    """gemma4's FFN of the residual stream h [N, D] (x: h through ffn_norm): its dense GeGLU MLP
    (post_ffw_norm_1 after) plus its experts (input pre_ffw_norm_2(h), router input
    rms(h) * ffn_gate_inp.scale / sqrt(D), GeGLU experts each scaled, post_ffw_norm_2 after).
    Returns the array holding the sum (x's buffer: x is read first); `out` is scratch."""
    e, eps, n = lw.experts, np.float32(cfg.norm_eps), x.shape[0]
    assert e is not None and e.router_scale is not None and e.input_norm is not None
    assert e.dense_norm is not None and e.post_norm is not None and lw.w_gate is not None
    assert lw.w_up is not None and lw.w_down is not None
    dense = ws.o2[:n]
    gate, up, act = ws.gate[:n, : lw.w_gate.rows], ws.up[:n, : lw.w_gate.rows], ws.act[:n, : lw.w_gate.rows]
    b.matmuls(x, (lw.w_gate, lw.w_up), (gate, up), ws)
    b.gelu_mul(gate, up, act)
    b.matmuls(act, (lw.w_down,), (out,), ws)
    b.rmsnorm(out, e.dense_norm, eps, dense)
    logits = ws.moe.logits[:n]
    b.rmsnorm(h, e.router_scale, eps, out)
    b.matmuls(out, (e.router,), (logits,), ws)
    b.rmsnorm(h, e.input_norm, eps, out)
    b.route_experts(e.router, out, cfg.expert_weights_norm, ws, GATINGS[cfg.expert_gating], e.select_bias, logits)
    if e.down_scale is not None:
        b.expert_scale(n, e.down_scale, ws)
    p = n * cfg.n_experts_used
    m = ws.moe
    b.expert_matmuls(m.xg[:p], (e.gate, e.up), (m.gate[:p], m.up[:p]), ws)
    b.gelu_mul(m.gate[:p], m.up[:p], m.act[:p])
    b.expert_matmuls(m.act[:p], (e.down,), (m.y[:p],), ws)
    b.combine_experts(m.y[:p], out, ws)
    b.rmsnorm(out, e.post_norm, eps, x)
    b.add(x, dense)
    return x
