"""The few primitives the CUDA kernels need beyond plain `numba.cuda`, each with a simulator
twin of the same arithmetic and order (numba's CUDA simulator runs kernels as Python and has no
inline PTX): `dp4a` (four int8 products summed into an int32, PTX `dp4a.s32.s32`) and
fixed-order block reductions in shared memory (no warp shuffles, which the simulator lacks and
whose order would differ: the same code runs in both). Moving to numba-cuda-mlir later is an import change here."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda
from numba.core import config, types

SIMULATOR = bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]
# Threads of the reducing kernels' blocks: a warp on a device; 4 in the simulator, which runs a
# Python thread per CUDA thread (the code is the same, with 4 partial sums instead of 32).
LANES = 4 if SIMULATOR else 32


def _dp4a_python(a, b, c):
    """c + sum of the four signed-byte products of a and b (int32 words), as dp4a.s32.s32."""
    s = int(c)
    for i in range(4):
        x = (int(a) >> (8 * i)) & 0xFF
        y = (int(b) >> (8 * i)) & 0xFF
        s += (x - 256 if x > 127 else x) * (y - 256 if y > 127 else y)
    return np.int32(s)


if SIMULATOR:
    dp4a = _dp4a_python
else:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def dp4a(typingctx, a, b, c):
        """dp4a.s32.s32: c + dot(bytes(a), bytes(b)), all signed."""
        if not all(isinstance(t, types.Integer) for t in (a, b, c)):
            return None
        sig = types.int32(types.int32, types.int32, types.int32)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.int32) for v, t in zip(args, signature.args)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32, i32]), "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen


@cuda.jit(device=True)
def block_sum(sh, tid, value):
    """The sum of `value` over the block's sh.shape[0] threads, added in thread order by every
    thread (one barrier to publish, one before sh is reused: the simulator pays per barrier,
    and a fixed order makes the result the same on every thread and every run)."""
    sh[tid] = value
    cuda.syncthreads()
    total = sh[0]
    for j in range(1, sh.shape[0]):
        total += sh[j]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def block_max(sh, tid, value):
    """The maximum of `value` over the block's threads, as block_sum."""
    sh[tid] = value
    cuda.syncthreads()
    total = sh[0]
    for j in range(1, sh.shape[0]):
        if sh[j] > total:
            total = sh[j]
    cuda.syncthreads()
    return total
