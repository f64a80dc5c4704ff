"""Tiny but complete GGUF models (llama, qwen2, gemma3) for fast engine tests.

Each writer produces a file the real loader accepts end to end: architecture metadata, a
byte-level BPE vocabulary (GPT-2's 256 byte characters, a few merges, chatml control tokens),
a chatml chat template and seeded random weights, quantized with the project's own quantizer
when `qtype` is not a float type. Weights are small (std ~0.05) so activations stay sane and
greedy decoding does not collapse onto one token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from edge_infer.formats.quants import quantize
from edge_infer.tokenizer.bpe import BYTE_ENCODER

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# (left, right) merges in rank order; each merged text is also a token.
MERGES = (("h", "e"), ("l", "l"), ("Ġ", "t"), ("Ġt", "he"), ("o", "r"), ("Ġ", "w"), ("Ġw", "or"), ("e", "r"))
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_NORMAL = 256 + len(MERGES)
ENDOFTEXT, IM_START, IM_END = N_NORMAL, N_NORMAL + 1, N_NORMAL + 2
VOCAB_SIZE = N_NORMAL + len(SPECIALS)  # 267

_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16}


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Shapes of a tiny model; head_dim defaults to d_model // n_heads."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn: int = 128
    head_dim: int | None = None
    context_length: int = 512

    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


def vocab_tokens() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the tiny byte-level BPE vocabulary."""
    tokens = list(BYTE_ENCODER) + [a + b for a, b in MERGES] + list(SPECIALS)
    types = [1] * N_NORMAL + [3] * len(SPECIALS)  # 1 normal, 3 control
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


def _add_tokenizer(w: GGUFWriter, add_bos: bool, chat_template: str = CHATML) -> None:
    tokens, types, merges = vocab_tokens()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ENDOFTEXT)
    w.add_eos_token_id(ENDOFTEXT)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(chat_template)


class _Weights:
    """Seeded random tensors added to a writer, quantized to `qtype` where they are matrices."""

    def __init__(self, w: GGUFWriter, qtype: str, seed: int, std: float = 0.05, widen: float = 1.0) -> None:
        """widen multiplies every matrix's std (wider models: smaller weights)."""
        self.w, self.qtype, self.std, self.widen = w, qtype.upper(), std, widen
        self.rng = np.random.default_rng(seed)

    def matrix(self, name: str, rows: int, cols: int, std: float | None = None) -> None:
        """A [rows, cols] weight (GGUF shape (cols, rows)): rows are output features."""
        sd = (self.std if std is None else std) * self.widen
        x = self.rng.normal(0.0, sd, (rows, cols)).astype(np.float32)
        if self.qtype in _FLOAT_TYPES:
            self.w.add_tensor(name, x.astype(_FLOAT_TYPES[self.qtype]))
            return
        qt = T[self.qtype]
        try:
            data = quantize(x, qt)
        except Exception as e:  # name the tensor: row length must be a multiple of the block
            raise ValueError(f"{name}: cannot quantize [{rows}, {cols}] to {self.qtype}: {e}") from e
        self.w.add_tensor(name, data, raw_dtype=qt)

    def stack(self, name: str, n: int, rows: int, cols: int, std: float | None = None) -> None:
        """n experts' [rows, cols] weights as one [n, rows, cols] tensor (GGUF shape (cols, rows, n))."""
        sd = (self.std if std is None else std) * self.widen
        x = self.rng.normal(0.0, sd, (n, rows, cols)).astype(np.float32)
        if self.qtype in _FLOAT_TYPES:
            self.w.add_tensor(name, x.astype(_FLOAT_TYPES[self.qtype]))
            return
        qt = T[self.qtype]
        data = quantize(x.reshape(n * rows, cols), qt)
        self.w.add_tensor(name, data.reshape(n, rows, -1), raw_dtype=qt)

    def vector(self, name: str, n: int, mean: float = 0.0, std: float = 0.02) -> None:
        self.w.add_tensor(name, (mean + self.rng.normal(0.0, std, n)).astype(np.float32))


def _write(
    path: str | Path,
    arch: str,
    spec: TinySpec,
    qtype: str,
    seed: int,
    *,
    tied: bool,
    add_bos: bool,
    qkv_bias: bool = False,
    gemma: bool = False,
    extra: dict[str, object] | None = None,
) -> Path:
    """Write one model: metadata, vocabulary, then every tensor the loader asks for."""
    path = Path(path)
    if path.is_dir():
        path = path / f"tiny-{arch}-{qtype.lower()}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    s, hd = spec, spec.hd
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch} {qtype}")
    w.add_uint32(f"{arch}.block_count", s.n_layers)
    w.add_uint32(f"{arch}.embedding_length", s.d_model)
    w.add_uint32(f"{arch}.attention.head_count", s.n_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", s.n_kv_heads)
    w.add_uint32(f"{arch}.feed_forward_length", s.ffn)
    w.add_uint32(f"{arch}.context_length", s.context_length)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6 if gemma else 1e-5)
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    if s.head_dim is not None:
        w.add_uint32(f"{arch}.attention.key_length", hd)
        w.add_uint32(f"{arch}.attention.value_length", hd)
    for k, v in (extra or {}).items():
        if isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, int(v))  # type: ignore[call-overload]
    _add_tokenizer(w, add_bos)

    # With tied embeddings the residual stream's own token embedding dominates the logits and
    # greedy decoding repeats one token forever: larger block outputs (V, O and down
    # projections; gemma: its post-norms) keep the tiny model's outputs varied.
    block_std = 0.8 if tied else 0.05
    # gemma GGUFs store norm weights with the +1 already added: norms are ~1 (post-norms ~4).
    post_norm = 4.0
    wt = _Weights(w, qtype, seed)
    q_dim, kv_dim = s.n_heads * hd, s.n_kv_heads * hd
    wt.matrix("token_embd.weight", VOCAB_SIZE, s.d_model, std=0.5 if not gemma else 0.5 / np.sqrt(s.d_model))
    if not tied:
        wt.matrix("output.weight", VOCAB_SIZE, s.d_model, std=0.5)
    wt.vector("output_norm.weight", s.d_model, mean=1.0)
    for i in range(s.n_layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", s.d_model, mean=1.0)
        wt.matrix(p + "attn_q.weight", q_dim, s.d_model, std=0.2)
        wt.matrix(p + "attn_k.weight", kv_dim, s.d_model, std=0.2)
        wt.matrix(p + "attn_v.weight", kv_dim, s.d_model, std=block_std)
        wt.matrix(p + "attn_output.weight", s.d_model, q_dim, std=block_std)
        if qkv_bias:
            wt.vector(p + "attn_q.bias", q_dim, std=0.1)
            wt.vector(p + "attn_k.bias", kv_dim, std=0.1)
            wt.vector(p + "attn_v.bias", kv_dim, std=0.1)
        if gemma:
            wt.vector(p + "attn_q_norm.weight", hd, mean=1.0)
            wt.vector(p + "attn_k_norm.weight", hd, mean=1.0)
            wt.vector(p + "post_attention_norm.weight", s.d_model, mean=post_norm)
            wt.vector(p + "post_ffw_norm.weight", s.d_model, mean=post_norm)
        wt.vector(p + "ffn_norm.weight", s.d_model, mean=1.0)
        wt.matrix(p + "ffn_gate.weight", s.ffn, s.d_model)
        wt.matrix(p + "ffn_up.weight", s.ffn, s.d_model)
        wt.matrix(p + "ffn_down.weight", s.d_model, s.ffn, std=block_std)
    finish(w)
    return path


def finish(w: GGUFWriter) -> None:
    """Write the header, metadata and tensors the writer holds, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama(
    path: str | Path,
    *,
    qtype: str = "F32",
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context_length: int = 512,
    tied: bool = False,
    add_bos: bool = True,
    seed: int = 0,
) -> Path:
    """A llama model (RMSNorm, SwiGLU, GQA, normal-order RoPE); `path` is a file or a folder.
    K-quant types need d_model and ffn multiples of 256."""
    spec = TinySpec(n_layers, d_model, n_heads, n_kv_heads, ffn, None, context_length)
    return _write(path, "llama", spec, qtype, seed, tied=tied, add_bos=add_bos)


def write_tiny_qwen2(
    path: str | Path,
    *,
    qtype: str = "F32",
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context_length: int = 512,
    tied: bool = True,
    seed: int = 1,
) -> Path:
    """A qwen2 model: llama's block plus Q/K/V biases and NEOX RoPE; tied embeddings, no BOS."""
    spec = TinySpec(n_layers, d_model, n_heads, n_kv_heads, ffn, None, context_length)
    return _write(path, "qwen2", spec, qtype, seed, tied=tied, add_bos=False, qkv_bias=True)


def write_tiny_gemma3(
    path: str | Path,
    *,
    qtype: str = "F32",
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 1,
    ffn: int = 128,
    head_dim: int = 32,
    sliding_window: int = 8,
    swa_pattern: int | None = 2,
    context_length: int = 512,
    seed: int = 2,
) -> Path:
    """A gemma3 model: QK-norm, post-attention/FFN norms, GeGLU, head_dim independent of
    d_model (key_length/value_length), sliding-window layers (every `swa_pattern`-th layer is
    global; None leaves the pattern key out, i.e. gemma's 6), tied embeddings."""
    spec = TinySpec(n_layers, d_model, n_heads, n_kv_heads, ffn, head_dim, context_length)
    extra: dict[str, object] = {"gemma3.attention.sliding_window": sliding_window}
    if swa_pattern is not None:
        extra["gemma3.attention.sliding_window_pattern"] = swa_pattern
    extra["gemma3.rope.freq_base_swa"] = 10000.0
    return _write(path, "gemma3", spec, qtype, seed, tied=True, add_bos=True, gemma=True, extra=extra)
