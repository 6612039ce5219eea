"""Triton kernel: write this step's K and V into the paged cache. Reference: `reference.store_kv_ref`."""

import torch
import triton
import triton.language as tl


@triton.jit
def store_kv_kernel(
    key_ptr, value_ptr,  # [T, H_kv, D], rows contiguous
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, H_kv, D], contiguous: slot s starts at s * ROW
    slot_mapping_ptr,  # [T] int64, -1 = padding (skip)
    key_stride, value_stride,  # elements between tokens
    ROW: tl.constexpr,  # H_kv * D
    BLOCK: tl.constexpr,  # next power of two >= ROW
):
    token = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    # The token's slot, broadcast over the row; int64 because slot * ROW overflows int32 in big caches.
    slot = tl.load(slot_mapping_ptr + token + tl.zeros([BLOCK], dtype=tl.int32)).to(tl.int64)
    mask = (offsets < ROW) & (slot >= 0)
    k = tl.load(key_ptr + token.to(tl.int64) * key_stride + offsets, mask=mask)
    v = tl.load(value_ptr + token.to(tl.int64) * value_stride + offsets, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offsets, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offsets, v, mask=mask)


def store_kv_triton(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key, value = key.reshape(num_tokens, -1), value.reshape(num_tokens, -1)  # views when rows are contiguous
    row = num_heads * head_dim
    store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )
