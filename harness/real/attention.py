"""The attention function the model calls through transformers' `AttentionInterface`.

It stores this step's K/V into the paged cache, then attends each request's queries over its own blocks. The
runner passes everything it needs as one `batch_meta` keyword that transformers forwards to every layer.
"""

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ragged_kernels import padded_paged_attention, ragged_paged_attention, store_kv

ATTENTION_NAME = "batchlab_paged"


@dataclass
class BatchMeta:
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v `[num_blocks, block_size, H_kv, D]`
    slot_mapping: torch.Tensor  # [T] (ragged) or [B * L] (padded); -1 for pad tokens
    seq_lens_k: torch.Tensor  # [S] cached tokens each sequence attends to, this step's included
    block_table: torch.Tensor  # [S, max_blocks], -1 padded
    padded: bool
    backend: str = "auto"  # kernels: auto (Triton on CUDA, torch on CPU) | triton | torch
    cu_seqlens_q: torch.Tensor | None = None  # ragged: [S + 1]
    max_seqlen_q: int = 0  # ragged: longest chunk, known on the host so the kernel launch needs no sync
    query_lens: torch.Tensor | None = None  # padded: [B] real (right-aligned) tokens per row
    max_seqlen_k: int | None = None  # padded: the longest row's cached tokens, known on the host


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, batch_meta=None,
                    **kwargs):
    """query `[B, H_q, L, D]`, key/value `[B, H_kv, L, D]` (B = 1 for ragged) → `([B, L, H_q, D], None)`."""
    k_cache, v_cache = batch_meta.kv_caches[module.layer_idx]
    # [B, H, L, D] → [B * L, H, D]: one token per row, in the order the slot mapping lists them.
    key_tokens = key.transpose(1, 2).flatten(0, 1)
    value_tokens = value.transpose(1, 2).flatten(0, 1)
    store_kv(key_tokens, value_tokens, k_cache, v_cache, batch_meta.slot_mapping, batch_meta.backend)
    if batch_meta.padded:
        out = padded_paged_attention(query, k_cache, v_cache, batch_meta.query_lens, batch_meta.seq_lens_k,
                                     batch_meta.block_table, scaling, batch_meta.max_seqlen_k)
        return out, None
    out = ragged_paged_attention(query[0].transpose(0, 1), k_cache, v_cache, batch_meta.cu_seqlens_q,
                                 batch_meta.seq_lens_k, batch_meta.block_table, scaling, batch_meta.backend,
                                 batch_meta.max_seqlen_q)  # [T, H_q, D]
    return out.unsqueeze(0), None


def register_paged_attention() -> str:
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    # Requests are kept apart by the block tables, not by a mask: tell transformers to build none.
    AttentionMaskInterface.register(ATTENTION_NAME, lambda *args, **kwargs: None)
    return ATTENTION_NAME
