"""Attention and KV-store kernels for paged, ragged batches, each with a torch reference beside it.

No `__version__` here on purpose: transformers probes for an installed hub package also named `kernels`.
"""

from kernels.reference import padded_paged_attention, ragged_paged_attention_ref, store_kv_ref

__all__ = ["padded_paged_attention", "ragged_paged_attention_ref", "store_kv_ref"]
