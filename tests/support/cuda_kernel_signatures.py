"""Every CUDA kernel with the argument types the backend launches it with (arrays as numba
types, 'A' layout as slices of the workspace are): what the PTX test compiles."""

from __future__ import annotations

from numba.core import types as nt

from edge_infer.kernels_cuda import attention, matmul, ops

f32, f64, i32, i64, i8, f16 = nt.float32, nt.float64, nt.int32, nt.int64, nt.int8, nt.float16
A1 = {t: nt.Array(t, 1, "A") for t in (f32, f64, i32, i64)}
u8 = nt.uint8
A2 = {t: nt.Array(t, 2, "A") for t in (f32, f16, i32, i64, i8, u8)}
A3 = nt.Array(f32, 3, "A")
A4 = {t: nt.Array(t, 4, "A") for t in (f32, f16)}


def signatures() -> list[tuple[str, object, tuple]]:
    """(name, dispatcher, argument types) for each kernel; the KV pool in f16 and f32."""
    x, xi, pos, slots = A2[f32], A2[i32], A1[i32], A1[i32]  # a step's inputs are int32 (graphs.PackedInputs)
    out = [
        ("quantize_q8", matmul.quantize_q8_kernel, (x, xi, x, xi)),
        ("matmul_codes", matmul.matmul_codes_kernel, (xi, x, xi, xi, nt.boolean, i64, x, x, x)),
        ("matmul_float f32", matmul.matmul_float_kernel, (x, x, x)),
        ("matmul_float f16", matmul.matmul_float_kernel, (x, A2[f16], x)),
        ("embed_codes", matmul.embed_codes_kernel, (pos, A2[i8], x, x, f32, x)),
        ("embed_nibbles", matmul.embed_nibbles_kernel, (pos, A2[u8], i64, x, x, f32, x)),
        ("embed_float", matmul.embed_float_kernel, (pos, A2[f16], f32, x)),
        ("rmsnorm", ops.rmsnorm_kernel, (x, A1[f32], f32, x)),
        ("add_rmsnorm", ops.add_rmsnorm_kernel, (x, x, A1[f32], f32, x)),
        ("silu_mul", ops.silu_mul_kernel, (x, x, x)),
        ("gelu_mul", ops.gelu_mul_kernel, (x, x, x)),
        ("scale", ops.scale_kernel, (x, f32)),
        ("add", ops.add_kernel, (x, x)),
        ("softcap", ops.softcap_kernel, (x, f32)),
        ("take_rows", ops.take_rows_kernel, (x, A1[i32], x)),
        ("take_ids", ops.take_ids_kernel, (A1[i32], A1[i32], A1[i32])),
        ("argmax", ops.argmax_kernel, (x, A1[i32])),
        ("attention_combine", attention.attention_combine_kernel, (A3, A3, A4[f32], x)),
    ]
    for kv in (f16, f32):
        cache = A4[kv]
        out += [
            (f"qkv_finish {kv}", attention.qkv_finish_kernel,
             (x, x, x, A1[f32], A1[f32], A1[f32], A1[f32], A1[f32], i64, pos, A1[f64], f64, nt.boolean, f32, slots,
              cache, cache)),
            (f"attention_part {kv}", attention.attention_part_kernel,
             (x, cache, cache, xi, pos, pos, f32, i64, f32, A3, A3, A4[f32])),
            (f"copy_blocks {kv}", attention.copy_blocks_kernel, (cache, cache, xi)),
        ]
    return out
