"""Triton kernel: causal attention for a ragged batch over the paged cache, prefill chunks and decodes in one
launch. Reference: `reference.ragged_paged_attention_ref`, which defines what this computes.

One program handles BLOCK_M queries of one sequence and one query head. It walks that sequence's keys BLOCK_N at
a time, looking each key's block up in the block table (so any block size works), with an online softmax in fp32.
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # queries per program; tl.dot needs every tile dimension >= 16
BLOCK_N = 32  # keys per inner step


@triton.jit
def ragged_paged_attention_kernel(
    q_ptr, out_ptr,  # [T, H_q, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, H_kv, D], contiguous
    cu_seqlens_q_ptr,  # [S + 1]
    seq_lens_k_ptr,  # [S]
    block_table_ptr,  # [S, max_blocks], -1 padded
    scale,
    q_stride_t, q_stride_h, out_stride_t, out_stride_h, block_table_stride,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # H_q // H_kv
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
    PAGE: tl.constexpr,  # block_size of the cache
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # True for fp32 inputs, and under the interpreter (its bf16 dot is wrong)
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_block = tl.program_id(2)
    kv_head = head // GROUP

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    k_len = tl.load(seq_lens_k_ptr + seq)

    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the sequence
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_valid = offs_m < q_len
    d_valid = offs_d < HEAD_DIM

    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * q_stride_t + head * q_stride_h + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    # Bottom-right causal alignment: query i sees keys 0 .. k_len - q_len + i.
    causal_limit = k_len - q_len + offs_m  # [BLOCK_M]
    # This program's last query sees keys below min(k_len, k_len - q_len + last + 1); nothing past that is read.
    # A program past the end of a short sequence (the grid fits the longest) reads nothing at all.
    k_end = tl.minimum(k_len, k_len - q_len + (q_block + 1) * BLOCK_M)
    k_end = tl.where(q_block * BLOCK_M < q_len, k_end, 0)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite, so fully masked rows never make NaN
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, k_end, BLOCK_N):
        pos = start_n + offs_n  # [BLOCK_N] key positions in the sequence
        n_valid = pos < k_len
        block = tl.load(block_table_ptr + seq.to(tl.int64) * block_table_stride + pos // PAGE, mask=n_valid,
                        other=0).to(tl.int64)
        slot = block * PAGE + pos % PAGE  # int64: large caches overflow int32 offsets
        kv_offsets = (slot[:, None] * NUM_KV_HEADS + kv_head) * HEAD_DIM + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale  # [BLOCK_M, BLOCK_N], fp32
        visible = (pos[None, :] <= causal_limit[:, None]) & n_valid[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_IN_FP32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_rows = (q_start + offs_m).to(tl.int64)
    tl.store(out_ptr + out_rows[:, None] * out_stride_t + head * out_stride_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def ragged_paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  cu_seqlens_q: torch.Tensor, seq_lens_k: torch.Tensor, block_table: torch.Tensor,
                                  scale: float, max_seqlen_q: int | None = None,
                                  interpreted: bool = False) -> torch.Tensor:
    """Same contract as the reference. `max_seqlen_q` (known to the caller) saves a device sync."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int(cu_seqlens_q.diff().max())
    grid = (len(seq_lens_k), num_heads, triton.cdiv(max_seqlen_q, BLOCK_M))
    ragged_paged_attention_kernel[grid](
        q, out, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PAGE=k_cache.shape[1], BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, DOT_IN_FP32=interpreted or q.dtype == torch.float32,
    )
    return out
