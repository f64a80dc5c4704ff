"""CPU kernels (numba). Kernel signatures: the backend boundary; kernels_cuda implements the same.

Every kernel writes into preallocated arrays and returns nothing. Arrays are C-contiguous, and
inputs never overlap outputs (the kernels are compiled with noalias arguments) except where a
kernel works in place. Integer scalars (qtype, n_threads, n_rot, window) are Python ints; eps,
scale and factor are np.float32. T/N tokens, K input width, R weight rows, D model width,
F FFN width, hd head_dim, n_kv KV heads (n_heads a multiple: head h reads kv head
h // (n_heads / n_kv)), S sequences.

Weights: uint8 [R, row_bytes], a row's GGUF blocks as in the file; qtype is the GGML type id
(formats.weight_types: one record per type, its sizes and the forms below; dequant.KERNEL_TYPES
the ids, BLOCK_SHAPE[qtype] = (elements, bytes) per block).

  matmul_kernel(x f32 [T, K], w, qtype, out f32 [T, R], n_threads)
      out[t, r] = sum_k x[t, k] * W[r, k]; n_threads row ranges (set numba's thread count too).
  matmul3_kernel(x, wa, qa, oa, wb, qb, ob, wc, qc, oc, n_threads)
      up to three matmuls of one x in one launch (Q/K/V, gate/up); a matrix with zero rows
      (uint8 [0, 1], out f32 [T, 0]) is skipped; each out equals matmul_kernel's bit for bit.
  embed_rows_kernel(ids i32 [N], w, qtype, out f32 [N, K])      out[i] = decoded row ids[i].

Int8 path (matmul_i8, its vector intrinsics in simd_i8, repack_i8), for the types with an int8
form (the 4-, 5- and 8-bit legacy types) repacked once at load into a 16-row-interleaved layout
(G = ceil(R / 16) groups, nb = K / 32 blocks; see matmul_i8):
  quantize_rows_q8(x f32 [T, K], xq4 i32 [T, K/4], xd f32 [T, K/32], xsum i32 [T, K/32 | K/16])
      per 32-block: d = max|x| / 127, int8 codes rint(x / d) packed 4 per int32, their sum
      (or the sums of its two halves, for the K-quant kernel).
  matmul_i8_kernel(xq4, xd, xsum, wi u8 [G, nb, 512 | 256 | 320], wd u16 [G, nb, 16] (f16 bits),
                   wm u16 [G, nb, 16] or [0, 0, 0], w_offset, out f32 [T, R], n_threads)
      out[t, r] = sum over blocks of float(sum(code * xq) - w_offset * xsum) * (d_w * d_x)
      [+ m_w * (d_x * xsum)], blocks in order; integer sums exact, so GEMV rows equal GEMM
      rows and any thread count gives the same bits.
  matmul3_i8_kernel(x f32 [T, K], xq4, xd, xsum, then (wi, wd, wm, w_offset, out) x 3, n_threads)
      quantizes x, then up to three matmuls of it in one launch (zero-group matrices skipped).
  repack_q8_0(w, wi, wd); repack_nibbles(w, has_min, fifth, wi, wd, wm)   GGUF rows -> it.
  decode_rows(qtype, w, r, out f32 [M, K], i)                    out[i] = decoded row r of w.
  decode_row(qtype, row u8 [row_bytes], out f32 [K])
      bit-exact with formats.quants.dequantize; an unknown qtype raises ValueError.

K-quant path (matmul_k, its vector intrinsics in simd_k and simd_i8, repack_k), for the types
with a K-quant form (Q4_K, Q5_K, Q6_K) with 256-wide rows, repacked at about the file's size into one
record per (16-row group, 256-column super-block) (G groups, S = K / 256; see repack_k); bits
and head are the form's code bits and header bytes (KWeights.args gives (wk, qtype, bits, head)):
  matmul_k_kernel(xq4, xd, xs16, wk u8 [G, S, B ~ 16 x type_size], qtype, bits, head, out f32 [T, R],
                  n_threads)
      per 32-column block: exact integer dot products, then float(isum) * ((d * sc) * d_x)
      [- (dmin * m) * (d_x * xsum)] (Q6_K: its two 16-column halves combined with their scales
      in integers first), blocks in order: batch- and thread-invariant as the int8 path.
  matmul3_k_kernel(x f32 [T, K], xq4, xd, xs16, then (wk, qtype, bits, head, out) x 3, n_threads)
      quantizes x once, then up to three matrices' row groups split over the threads.

Mixture of experts (moe: routing and combination; matmul_experts: the grouped matmuls). A step's
N tokens each choose k of E experts; the P = N * k (token, expert) pairs are numbered grouped by
expert (expert order, then token order): expert e's pairs are rows offsets[e]..offsets[e + 1] - 1
of every pair-major buffer. Expert stacks are QMatrix with data uint8 [E, R, row_bytes], packed
with a leading expert axis (wk [E, G, S, B]; wi [E, G, nb, bb], wd, wm [E, G, nb, 16] or
[E, 0, 0, 0]) when R is a multiple of 16, else left as GGUF blocks for the float path.
  route_kernel(logits f32 [N, E], router f32 [E, D] or [0, 1] (logits given), norm, x f32 [N, D],
               sel i32 [N, k], wts f32 [N, k], offsets i32 [E + 1], pair_token i32 [P],
               pair_of i32 [N, k], xg f32 [P, D])
      per token: logits = x . router rows (when given a router), softmax (float64 sum), the k
      largest in descending order (ties: lower id), weights = their probabilities, / their sum
      (clamped at 2^-14) when norm; then the grouping and xg[p] = x[pair_token[p]].
  expert_matmul2_k_kernel(x f32 [P, K], xq4, xd, xs16, offsets, wka, qa, ba, ha, outa f32 [P, Ra],
                          wkb, qb, bb, hb, outb, n_threads)
  expert_matmul2_i8_kernel(x, xq4, xd, xsum, offsets, wia, wda, wma, offa, outa, wib, wdb, wmb,
                           offb, outb, n_threads)
  expert_matmul2_kernel(x, offsets, wa u8 [E, R, row_bytes], qa, outa, wb, qb, outb, n_threads)
      out_m[p] = x[p] @ M[e].T for each pair p of expert e, one or two stacks (the second with
      zero groups or rows when unused); x quantized once per row as by quantize_rows_q8; each
      pair's row is bit-identical to the dense kernel's product of its token with expert e's
      matrix; only experts with pairs are read; work items (expert, row group) split over the
      threads by cost (pairs + ITEM_OVERHEAD).
  combine_kernel(y f32 [P, D], pair_of, wts, out f32 [N, D])
      out[t] = sum over j (in choice order) of wts[t, j] * y[pair_of[t, j]].
  gated_add_kernel(x f32 [N, D], g f32 [D], y f32 [N, D], out f32 [N, D])
      out[t] += sigmoid(x[t] . g) * y[t] (qwen2moe's shared expert).

KV pool of one layer: v_cache [num_blocks, block_size, n_kv, hd] and k_cache [num_blocks, n_kv,
hd, block_size] (each block's keys transposed, so 16 keys of one dimension are one vector: the
lanes of the attention scores) of uint16 (IEEE half bits: numba has no float16) or float32, with
empty float32 arrays (shape (0, 0, 0)) in the scale places k_scale, v_scale; or, for llama.cpp's
quantized KV types (kv_quant: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), K and V alike uint8
[num_blocks, block_size, n_kv, hd / 32 * block bytes] with int64 [2] (GGML type id, Hadamard
rotation size or 0) in the scale place; K and V may differ. Token j of sequence s lives in block
block_tables[s, j // block_size] at offset j % block_size; its slot = block * block_size +
offset. block_tables: int32 [S, max_blocks]; slot_mapping: int64 [N] (negative = not stored);
positions: int32 [N]; token_seq: int32 [N], the block_tables row of each token.

  store_kv_kernel(k f32 [N, n_kv*hd], v f32 [N, n_kv*hd], slot_mapping, k_cache, k_scale,
                  v_cache, v_scale)
      writes each token's K and V (rounded to the pool's type) at its slot.
  qkv_finish_kernel(q f32 [N, n_heads*hd], k, v f32 [N, n_kv*hd], bq, bk, bv, q_norm, k_norm,
                    n_rot, positions, inv_freq f64 [n_rot/2], mscale, neox, eps, slot_mapping,
                    k_cache, k_scale, v_cache, v_scale)
      in place on q, k, v: + biases (bq, bk, bv f32 [C], or empty [0]); RMSNorm of each head of
      q and k (q_norm, k_norm f32 [hd]), or of the whole rows (f32 [n_heads*hd], [n_kv*hd]), or
      none (empty); RoPE of q and k on the first n_rot dims (angle = position * inv_freq[i], cos
      and sin times mscale; neox: pairs (i, i + n_rot/2), else (2i, 2i + 1)); then stores k, v
      like store_kv_kernel.
  paged_attention_kernel(q f32 [N, n_heads*hd], k_cache, k_scale, v_cache, v_scale,
                         block_tables, token_seq, positions, scale, window, softcap, sinks,
                         out f32 [N, n_heads*hd], n_threads)
      causal softmax(s) V, s = scale * q.K (softcap > 0: softcap * tanh(s / softcap); sinks f32
      [n_heads]: gpt-oss's per-head logit in the softmax with no value, [0]: none), over
      keys 0..p of the token's own sequence (window > 0: only keys j with p - j < window). A sequence's tokens are consecutive in the batch with
      increasing positions. K/V are read from the pool, including this step's (store first).
      (kernels_cpu.attention_tiles: up to 16 of a sequence's tokens share each key and value
      converted; a score is the sequential fused multiply-add chain over the head dimension,
      so a token's row is the same bits in any tile, batch or chunk.)

Per-row ops, float32, rows independent:
  rmsnorm_kernel(x [T, D], w [D], eps, out [T, D])   out = x / sqrt(mean(x^2) + eps) * w
                                                     (sum of squares in float64, index order)
  add_rmsnorm_kernel(h [T, D], delta [T, D], w [D], eps, out [T, D])
      h += delta in place (the residual stream), then out = rmsnorm(h) * w.
  silu_mul_kernel(gate [T, F], up [T, F], out [T, F])    out = silu(gate) * up
  gelu_mul_kernel(gate [T, F], up [T, F], out [T, F])    out = gelu_tanh(gate) * up
  scale_kernel(x [T, D], factor)                         x *= factor in place

Recurrent layers (recurrent.py; a state slot per sequence, seq_slot [S], token_seq [N]):
  short_conv_kernel(bcx [N, 3D], w [D, L], state [slots, L-1, D], seq_slot, token_seq, positions,
      snap_rows [P], snap_slots [P], out [N, D])   LFM2's block between in_proj and out_proj:
      c * causal depthwise conv of b * x over [state, this step's b * x]; a token at position 0
      starts from a zero state; after token snap_rows[i] the state is also copied to snap_slots[i].
  conv_silu_kernel(src, off, w [C, L], bias [C], state [slots, L-1, C], ..., out [N, C])
      Mamba2's silu(conv + bias) of src's columns off..off+C (x, B, C).
  ssm_scan_kernel(xbc [N, H*P + 2*G*Ns], zxdt, dt_off, dt_bias [H], a [H], d [H],
      state [slots, H, P, Ns], ..., y [N, H*P])   the selective scan + D x (threads split heads).
  gated_group_rmsnorm_kernel(y, z, w, groups, eps, out)   rmsnorm per group of y * silu(z), * w.
  delta_rule_kernel(qkv, beta, alpha, dt_bias, a, state [slots, H, S, S], ..., k_head_of [H], eps,
      y)   the gated delta rule (threads split value heads; each value head's key head given); head_rmsnorm_gate_kernel(y, z, w,
      eps, out): rmsnorm per head * w * silu(z). ops: split_gated_q_kernel, sigmoid_mul_kernel
      (gated attention's [q | gate] split and sigmoid gate).

The backend (backend.CpuBackend): the seam the model layer calls (edge_infer.models.backend
.Backend); kernels_cuda's backend has the same methods over device arrays:
  prepare_weights(gguf, [(role, QMatrix)]) -> [QMatrix]    role "layer" | "output"; decides the
      int8 repack (the types whose int8 form takes the role: Q4_0..Q8_0 layer matrices, a Q8_0
      output; the K-quant forms with 256-wide rows for the K-quant kernel) and sets QMatrix.packed.
  make_workspace(capacity, D, Q, KV, F) -> Workspace       every scratch buffer of a forward
      (workspace.py: named fields, shapes in comments); a step of n tokens uses rows [:n].
  kv_block_bytes(...), make_kv_pool(n_layers, num_blocks, block_size, n_kv, hd, kv_dtype[, kv_dtype_v]),
      copy_blocks(kv, [(src, dst)])                          the KV pool above;
      make_state_pool(shapes, num_slots), copy_states(states, [(src, dst)]) a hybrid's state slots.
  matmuls(x, (w, ...), (out, ...), workspace)      one to three matmuls of x (matmul3_kernel /
      matmul3_i8_kernel by each matrix's form); embed(ids, emb, scale, out);
      qkv_finish(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, neox, eps,
      slot_mapping, kv_layer); attention(q, kv_layer, block_tables, token_seq, positions, scale,
      window, out); rmsnorm, add_rmsnorm, silu_mul, gelu_mul, relu_mul (ReGLU), relu_sqr,
      xielu (ungated activations) as the kernels below;
      take_rows(x, rows, out); softcap(x, cap)    x = tanh(x / cap) * cap in place.
  make_workspace(..., experts=(E, k, Fe)) adds workspace.moe (ExpertWorkspace: router logits,
      choices, pair buffers). route_experts(router, x, norm, workspace, sigmoid, bias, logits)
      (an F32 router inside route_kernel, others by a matmul first, or logits given; softmax or
      sigmoid, a selection bias); expert_matmuls(x [P, K], (stack, ...), (out, ...),
      workspace); combine_experts(y, out, workspace); gated_add(x, g, y, out).

Batch invariance (every kernel, every backend): a token's outputs depend only on its own
inputs, the weights and its sequence's cached K/V, never on the rest of the batch, its place in
it, chunking or n_threads. Each output has one fixed accumulation order; threads split output
rows or work items, never a reduction; a GEMV row is bit-identical to the same GEMM row; and
attention reads this step's K/V back from the pool, so a token's output is the same whether its
context was computed in this chunk or an earlier one.

Modules: backend, target (the CPU the kernels compile for; each weight type's path), jit_cache (numba's cache of them),
workspace, dequant, matmul, matmul_i8 (its vector intrinsics in simd_i8, on simd_dot and simd_isa),
repack_i8, matmul_k (simd_k), repack_k, moe, matmul_experts, membw (read bandwidth), attention, ops, recurrent (hybrid models' state kernels; reference_recurrent their twins), fastmath (vectorizable exp/tanh/silu/gelu), reference (the NumPy
twins), _jit (codegen settings, the kernel decorator, f16/bf16 bit helpers). This file imports
nothing: importing the package stays cheap.
"""
