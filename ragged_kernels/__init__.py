"""Attention and KV-store kernels for paged, ragged batches, each with a torch reference beside it.

Dispatch: Triton for CUDA tensors, the torch reference for CPU ones; `backend="triton"|"torch"` forces either
(Triton on CPU tensors needs TRITON_INTERPRET=1 set before this package is imported).
No `__version__` here on purpose: transformers probes for an installed hub package also named `kernels`.
"""

import os

import torch

from ragged_kernels.reference import padded_paged_attention, ragged_paged_attention_ref, store_kv_ref

try:  # Triton ships for Linux only; elsewhere the torch path still runs
    from ragged_kernels.paged_attention import ragged_paged_attention_triton
    from ragged_kernels.store_kv import store_kv_triton
except ImportError:  # pragma: no cover - depends on the platform
    ragged_paged_attention_triton = store_kv_triton = None

BACKENDS = ("auto", "triton", "torch")


def use_triton(backend: str, tensor: torch.Tensor) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"kernel backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    wanted = backend == "triton" or (backend == "auto" and tensor.is_cuda)
    if wanted and store_kv_triton is None:
        raise RuntimeError("the Triton backend was asked for but triton is not installed")
    return wanted


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def store_kv(key, value, k_cache, v_cache, slot_mapping, backend: str = "auto") -> None:
    """Write key/value `[T, H_kv, D]` into the caches at `slot_mapping[T]` (negative = skip)."""
    if use_triton(backend, key):
        store_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(key, value, k_cache, v_cache, slot_mapping)


def ragged_paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table, scale,
                           backend: str = "auto", max_seqlen_q: int | None = None) -> torch.Tensor:
    """Causal attention of each sequence's queries over its own paged keys: q `[T, H_q, D]` → `[T, H_q, D]`."""
    if use_triton(backend, q):
        return ragged_paged_attention_triton(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table, scale,
                                             max_seqlen_q=max_seqlen_q, interpreted=interpreted())
    return ragged_paged_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table, scale)


__all__ = ["BACKENDS", "padded_paged_attention", "ragged_paged_attention", "ragged_paged_attention_ref",
           "store_kv", "store_kv_ref", "use_triton"]
