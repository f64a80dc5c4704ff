"""CUDA kernels (numba.cuda) and the CUDA backend: the same backend interface as kernels_cpu
(edge_infer.models.backend.Backend) over device arrays, chosen by `LLM(device="cuda")` or by
`device="auto"` when numba-cuda (the `[cuda]` extra) finds a device.

Modules: intrinsics (dp4a by inline PTX, fixed-order block reductions, the simulator's twins),
layout (GGUF matrices -> int8 codes with a scale and an offset per 16 columns, or float rows;
on the host, once), matmul (activation quantization, the dp4a and float matmuls, embedding
rows), attention (the QKV finish, paged attention in partitions and their combination, block
copies), ops (norms, activations, elementwise ops, argmax), graphs (a step's inputs in one
buffer; decode and verification steps recorded once per padded size and replayed as CUDA
graphs), backend (CudaBackend).

Kernel shapes follow kernels_cpu/__init__.py; each module's docstring gives its launch grid.
Every kernel keeps batch invariance: a token's outputs are computed by the same threads in the
same order whatever the batch, and attention partitions start at absolute key positions.
Tested without a GPU: under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, against the NumPy
twins and the CPU backend) and by compiling every kernel to PTX for sm_90. This file imports
nothing: importing the package does not load numba.cuda.
"""
