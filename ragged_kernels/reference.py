"""Torch reference implementations: they define what the kernels compute, and run the CPU path.

Shapes: T tokens in a step, S sequences, H_q / H_kv query / key-value heads, D head dim,
cache `[num_blocks, block_size, H_kv, D]`, block tables `[S, max_blocks]` padded with -1.
"""

import math

import torch
import torch.nn.functional as F


def store_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Write key/value `[T, H_kv, D]` into the caches at `slot_mapping[T]`; a negative slot is skipped (padding)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table_row: torch.Tensor, k_len: int) -> torch.Tensor:
    """The first `k_len` cached tokens of one sequence: `[k_len, H_kv, D]`."""
    block_size = cache.shape[1]
    blocks = block_table_row[: math.ceil(k_len / block_size)]
    return cache.index_select(0, blocks).flatten(0, 1)[:k_len]


def gather_kv_padded(cache: torch.Tensor, block_table: torch.Tensor, k_max: int) -> torch.Tensor:
    """The first `k_max` cached slots of each sequence: `[S, k_max, H_kv, D]`. Slots past a sequence's length (and
    its -1 table entries, read as block 0) hold junk that the caller must mask."""
    num_seqs, block_size = block_table.shape[0], cache.shape[1]
    blocks = block_table[:, : math.ceil(k_max / block_size)].clamp(min=0)  # [S, nb]
    # index_select on the flattened table is several times faster on CPU than advanced indexing.
    gathered = cache.index_select(0, blocks.flatten()).view(num_seqs, -1, *cache.shape[2:])  # [S, nb*bs, H, D]
    return gathered[:, :k_max]


def ragged_paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               cu_seqlens_q: torch.Tensor, seq_lens_k: torch.Tensor, block_table: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """Causal attention of each sequence's queries over its own cached keys. q `[T, H_q, D]` → `[T, H_q, D]`.

    Sequence i owns queries cu_seqlens_q[i]:cu_seqlens_q[i+1] and its first seq_lens_k[i] cached tokens (this
    step's keys already stored). Bottom-right causal alignment, as FlashAttention: with q_len queries over k_len
    keys, query j sees keys 0 .. k_len - q_len + j. Softmax in fp32.

    Decodes (one query each) go through one batched call, since a continuous batch is mostly decodes; prefill
    chunks go one by one.
    """
    out = torch.empty_like(q)
    q_lens = cu_seqlens_q.diff()  # [S]
    decodes = (q_lens == 1).nonzero().flatten()
    if len(decodes):
        k_lens = seq_lens_k[decodes]  # [S_d]
        k_max = int(k_lens.max())
        k = gather_kv_padded(k_cache, block_table[decodes], k_max)  # [S_d, K, H_kv, D]
        v = gather_kv_padded(v_cache, block_table[decodes], k_max)
        visible = torch.arange(k_max, device=q.device)[None, :] < k_lens[:, None]  # [S_d, K]
        rows = cu_seqlens_q[decodes]
        o = F.scaled_dot_product_attention(
            q[rows][:, :, None].float(),  # [S_d, H_q, 1, D]
            k.transpose(1, 2).float(), v.transpose(1, 2).float(),  # [S_d, H_kv, K, D]
            attn_mask=visible[:, None, None, :], scale=scale, enable_gqa=True,
        )
        out[rows] = o[:, :, 0].to(q.dtype)
    starts = cu_seqlens_q.tolist()
    k_lens = seq_lens_k.tolist()
    for i in (q_lens > 1).nonzero().flatten().tolist():
        q_start, q_end, k_len = starts[i], starts[i + 1], k_lens[i]
        k = gather_kv(k_cache, block_table[i], k_len)  # [K, H_kv, D]
        v = gather_kv(v_cache, block_table[i], k_len)
        q_len = q_end - q_start
        visible = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)  # [Q, K]
        o = F.scaled_dot_product_attention(
            q[q_start:q_end].transpose(0, 1).float(),  # [H_q, Q, D]
            k.transpose(0, 1).float(), v.transpose(0, 1).float(),  # [H_kv, K, D]
            attn_mask=visible, scale=scale, enable_gqa=True,
        )
        out[q_start:q_end] = o.transpose(0, 1).to(q.dtype)
    return out


def padded_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_lens: torch.Tensor,
                           seq_lens_k: torch.Tensor, block_table: torch.Tensor, scale: float,
                           max_seqlen_k: int | None = None) -> torch.Tensor:
    """Attention for a left-padded `[B, L]` rectangle, computed in full as a padded engine does.

    q `[B, H_q, L, D]` → `[B, L, H_q, D]`. Row b's real queries are its last query_lens[b] positions; it attends
    over its first seq_lens_k[b] cached tokens. Pad queries still run (over no visible key: a uniform average),
    since padding is real compute; their outputs are never read. `max_seqlen_k`, when the caller knows it on the
    host, spares a device sync per layer.
    """
    width = q.shape[2]
    k_max = max(int(seq_lens_k.max()) if max_seqlen_k is None else max_seqlen_k, 1)
    k = gather_kv_padded(k_cache, block_table, k_max)  # [B, K, H_kv, D]
    v = gather_kv_padded(v_cache, block_table, k_max)
    key_pos = torch.arange(k_max, device=q.device)  # [K]
    if width == 1:
        # A decode rectangle, the common step of padded batching: each row's one query sees its whole cached
        # sequence, so a boolean mask over keys does. An idle row (a finished request's) runs over its own
        # cache as a padded engine computes it (at least key 0, so it stays finite); its output is never read.
        visible = key_pos[None, :] < seq_lens_k.clamp(min=1)[:, None]  # [B, K]
        o = F.scaled_dot_product_attention(
            q.float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),  # [B, H, 1|K, D]
            attn_mask=visible[:, None, None, :], scale=scale, enable_gqa=True,
        )
        return o.transpose(1, 2).to(q.dtype)
    # Real query j (0-based among the row's real ones) sits at column width - q_len + j and sees keys up to
    # k_len - q_len + j, i.e. key_pos <= k_len - width + column.
    column = torch.arange(width, device=q.device)  # [L]
    limit = (seq_lens_k - width)[:, None] + column[None, :]  # [B, L]
    visible = (key_pos[None, None, :] <= limit[:, :, None]) & (key_pos[None, None, :] < seq_lens_k[:, None, None])
    is_real = column[None, :] >= (width - query_lens)[:, None]  # [B, L]
    visible &= is_real[:, :, None]
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=q.device)
    bias.masked_fill_(~visible, torch.finfo(torch.float32).min)  # finite, so fully masked pad rows stay finite
    o = F.scaled_dot_product_attention(
        q.float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),  # [B, H, L|K, D]
        attn_mask=bias[:, None], scale=scale, enable_gqa=True,
    )
    return o.transpose(1, 2).to(q.dtype)
