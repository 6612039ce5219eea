"""Triton kernels against their torch references: on CUDA when there is one, else in Triton's interpreter."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from ragged_kernels import (
    padded_paged_attention,
    ragged_paged_attention,
    ragged_paged_attention_ref,
    store_kv,
    store_kv_ref,
)
from ragged_kernels.bench import random_paged_batch, run_bench
from ragged_kernels.compile_check import sources
from tests.conftest import ROOT

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_batch(q_lens, k_lens, num_kv_heads, group, head_dim, block_size, dtype, num_blocks=None, seed=0):
    return random_paged_batch(q_lens, k_lens, num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype,
                              DEVICE, num_blocks, seed)


def attention_in_dtype(q, k_cache, v_cache, cu, k_lens, table, scale):
    """The same math as the reference, done in the inputs' own dtype: the error budget for low precision."""
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    for i, k_len in enumerate(k_lens.tolist()):
        start, end = cu[i].item(), cu[i + 1].item()
        blocks = table[i, : math.ceil(k_len / block_size)]
        k = k_cache[blocks].flatten(0, 1)[:k_len].transpose(0, 1)  # [H_kv, K, D]
        v = v_cache[blocks].flatten(0, 1)[:k_len].transpose(0, 1)
        group = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q[start:end].transpose(0, 1) @ k.transpose(1, 2) * scale  # [H, Q, K]
        visible = torch.ones(end - start, k_len, dtype=torch.bool, device=q.device).tril(k_len - (end - start))
        out[start:end] = (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v).transpose(0, 1)
    return out


# (q_lens, k_lens, H_kv, GQA group, head_dim, block_size)
CASES = {
    "mixed": ([1, 7, 1, 20], [9, 7, 30, 25], 2, 4, 64, 16),
    "decode-only": ([1, 1, 1, 1, 1], [5, 40, 17, 1, 64], 2, 4, 64, 16),
    "prefill-only": ([12, 33], [12, 33], 1, 8, 64, 1),
    "chunked-prefill-on-cached-prefix": ([16, 5], [60, 21], 2, 1, 128, 32),
    "gqa-1": ([3, 1], [3, 20], 4, 1, 64, 16),
    "gqa-8-block-1": ([2, 1, 17], [9, 4, 17], 1, 8, 128, 1),
    "block-32-long-decode": ([1, 1], [100, 33], 1, 4, 64, 32),
}


@pytest.mark.parametrize("case", CASES)
def test_attention_matches_reference_fp32(case):
    q_lens, k_lens, kv_heads, group, head_dim, block_size = CASES[case]
    batch = make_batch(q_lens, k_lens, kv_heads, group, head_dim, block_size, torch.float32)
    scale = head_dim**-0.5
    out = ragged_paged_attention(*batch, scale, backend="triton")
    torch.testing.assert_close(out, ragged_paged_attention_ref(*batch, scale), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["mixed", "chunked-prefill-on-cached-prefix", "gqa-8-block-1"])
def test_attention_low_precision_error_is_at_most_twice_torchs(case, dtype):
    q_lens, k_lens, kv_heads, group, head_dim, block_size = CASES[case]
    batch = make_batch(q_lens, k_lens, kv_heads, group, head_dim, block_size, dtype)
    scale = head_dim**-0.5
    exact = ragged_paged_attention_ref(*batch, scale).float()  # fp32 math on the same low-precision inputs
    kernel_error = (ragged_paged_attention(*batch, scale, backend="triton").float() - exact).abs().max()
    torch_error = (attention_in_dtype(*batch, scale).float() - exact).abs().max()
    assert kernel_error <= 2 * torch_error + 1e-5, (kernel_error, torch_error)


def test_attention_with_many_blocks_and_a_shuffled_table():
    batch = make_batch([4, 1, 1], [50, 700, 3], 1, 4, 64, 16, torch.float32, num_blocks=20_000, seed=3)
    out = ragged_paged_attention(*batch, 0.125, backend="triton")
    torch.testing.assert_close(out, ragged_paged_attention_ref(*batch, 0.125), atol=2e-5, rtol=1e-5)


def test_each_sequence_reads_only_its_own_blocks():
    """Poison every block no sequence owns: a kernel reading outside its table would return NaN."""
    q, k_cache, v_cache, cu, k_lens, table = make_batch([3, 1], [20, 9], 2, 2, 64, 4, torch.float32)
    owned = torch.zeros(k_cache.shape[0], dtype=torch.bool, device=DEVICE)
    owned[table[table >= 0]] = True
    k_cache[~owned], v_cache[~owned] = float("nan"), float("nan")
    out = ragged_paged_attention(q, k_cache, v_cache, cu, k_lens, table, 0.125, backend="triton")
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_reference_and_skips_padding(dtype):
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn((40, 16, 2, 64), generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn((40, 16, 2, 64), generator=gen).to(dtype).to(DEVICE)
    key = torch.randn((6, 2, 64), generator=gen).to(dtype).to(DEVICE)
    value = torch.randn((6, 2, 64), generator=gen).to(dtype).to(DEVICE)
    slots = torch.tensor([5, -1, 639, 0, -1, 200], device=DEVICE)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, expected_k, expected_v, slots)
    store_kv(key, value, k_cache, v_cache, slots, backend="triton")
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_store_kv_from_a_strided_view():
    """The runner hands over keys as a transposed view of the model's `[1, H, T, D]` tensor."""
    key = torch.randn(1, 2, 5, 64, device=DEVICE).transpose(1, 2).flatten(0, 1)  # [T, H, D], not contiguous
    k_cache, v_cache = torch.zeros(4, 4, 2, 64, device=DEVICE), torch.zeros(4, 4, 2, 64, device=DEVICE)
    store_kv(key, key, k_cache, v_cache, torch.arange(5, device=DEVICE), backend="triton")
    assert torch.equal(k_cache.flatten(0, 1)[:5], key)


def test_padded_attention_matches_ragged_on_the_real_tokens():
    """The padded path (static, dynamic) must agree with the ragged reference wherever a token is real."""
    q_lens, k_lens = [3, 1, 5], [10, 4, 5]
    q, k_cache, v_cache, cu, k_len_t, table = make_batch(q_lens, k_lens, 2, 4, 64, 4, torch.float32)
    ragged = ragged_paged_attention_ref(q, k_cache, v_cache, cu, k_len_t, table, 0.125)
    width = max(q_lens)
    rect = torch.zeros(len(q_lens), q.shape[1], width, q.shape[2], device=DEVICE)  # [B, H, L, D], left-padded
    for b, n in enumerate(q_lens):
        rect[b, :, width - n:] = q[cu[b]:cu[b + 1]].transpose(0, 1)
    padded = padded_paged_attention(rect, k_cache, v_cache, torch.tensor(q_lens, device=DEVICE), k_len_t, table,
                                    0.125)  # [B, L, H, D]
    for b, n in enumerate(q_lens):
        torch.testing.assert_close(padded[b, width - n:], ragged[cu[b]:cu[b + 1]], atol=1e-6, rtol=1e-6)
    assert not padded.isnan().any()


def test_kernels_compile_for_sm80_and_sm90(tmp_path):
    """The interpreter accepts code the GPU compiler rejects: compile for real targets, with a fresh cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "ragged_kernels.compile_check", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout)
    kernels = {name for name, _ in sources()}
    assert {(r["target"], r["kernel"]) for r in rows} == {(t, k) for t in ("sm_80", "sm_90") for k in kernels}
    assert all(r["cubin_bytes"] > 0 for r in rows)


def test_the_benchmark_checks_and_times_every_implementation():
    results = run_bench(decodes=3, ctx_min=16, ctx_max=40, prefill=16, prefill_ctx=20, heads=4, kv_heads=2,
                        head_dim=32, dtype="float32", iters=2)
    expected = {"torch reference", "torch SDPA per sequence", "store_kv torch"}
    if DEVICE == "cuda":
        expected |= {"triton", "store_kv triton"}
    assert expected <= set(results) and all(seconds > 0 for seconds in results.values())


def test_the_benchmark_refuses_to_time_a_wrong_implementation(monkeypatch):
    import ragged_kernels.bench

    monkeypatch.setattr(ragged_kernels.bench, "sdpa_per_sequence", lambda q, *args: torch.zeros_like(q))
    with pytest.raises(AssertionError, match="torch SDPA per sequence differs from the torch reference"):
        run_bench(decodes=2, ctx_min=8, ctx_max=9, prefill=4, prefill_ctx=6, heads=2, kv_heads=1, head_dim=16,
                  dtype="float32", iters=1)


@pytest.mark.slow
def test_attention_on_a_realistic_step_bf16():
    """A continuous-batching step at Llama-2-7B head shapes (slow in the interpreter)."""
    batch = make_batch([1] * 12 + [64], [300 + 37 * i for i in range(12)] + [200], 8, 4, 128, 16, torch.bfloat16)
    scale = 128**-0.5
    exact = ragged_paged_attention_ref(*batch, scale).float()
    kernel_error = (ragged_paged_attention(*batch, scale, backend="triton").float() - exact).abs().max()
    torch_error = (attention_in_dtype(*batch, scale).float() - exact).abs().max()
    assert kernel_error <= 2 * torch_error + 1e-5
