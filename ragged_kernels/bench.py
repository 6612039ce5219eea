"""Time ragged paged attention on a continuous-batching step: `python -m ragged_kernels.bench [--help]`.

Default shape: 64 decodes at contexts of 1-4k plus one 512-token prefill chunk, Llama-2-7B-like heads, bf16.
Prints each implementation's median time and its ratio to the Triton kernel, measured side by side in one run:
the Triton kernel, the torch reference, torch SDPA on the same keys gathered per sequence, and, where installed,
FlashAttention's paged varlen API. On a CPU it runs the torch paths only (use small shapes).
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

from harness.machine_load import MachineLoad, machine_line
from ragged_kernels import ragged_paged_attention, ragged_paged_attention_ref, store_kv, store_kv_ref
from ragged_kernels.reference import gather_kv


def random_paged_batch(q_lens, k_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device,
                       num_blocks=None, seed=0):
    """A random paged cache holding each sequence's keys in shuffled blocks, and queries for the last q_len of
    them: (q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table), the kernels' arguments."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [math.ceil(k / block_size) for k in k_lens]
    num_blocks = num_blocks or sum(blocks) + 3
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    order = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(k_lens), max(blocks)), -1, dtype=torch.long)
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = order[start:start + n]
        start += n
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen).to(device, dtype)
    return q, k_cache, v_cache, cu.to(device), torch.tensor(k_lens, device=device), table.to(device)


def build_step(num_decodes, ctx_min, ctx_max, prefill, prefill_ctx, num_heads, num_kv_heads, head_dim, block_size,
               dtype, device, seed=0):
    """A continuous-batching step: `num_decodes` decodes at random contexts plus one prefill chunk."""
    gen = torch.Generator().manual_seed(seed)
    k_lens = torch.randint(ctx_min, ctx_max + 1, (num_decodes,), generator=gen).tolist() + [prefill_ctx]
    q_lens = [1] * num_decodes + [prefill]
    return random_paged_batch(q_lens, k_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device,
                              seed=seed)


def sdpa_per_sequence(q, k_cache, v_cache, cu, k_lens, table, scale):
    """torch SDPA over each sequence's keys gathered from the cache: what a framework without a paged kernel does."""
    out = torch.empty_like(q)
    starts = cu.tolist()
    for i, k_len in enumerate(k_lens.tolist()):
        qs = q[starts[i]:starts[i + 1]].transpose(0, 1)[None]  # [1, H, Q, D]
        k = gather_kv(k_cache, table[i], k_len).transpose(0, 1)[None]
        v = gather_kv(v_cache, table[i], k_len).transpose(0, 1)[None]
        q_len = qs.shape[2]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        out[starts[i]:starts[i + 1]] = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale,
                                                                      enable_gqa=True)[0].transpose(0, 1)
    return out


def flash_attn_paged():
    """FlashAttention's varlen API with a block table, when installed (it wants blocks of 256 slots)."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def run(q, k_cache, v_cache, cu, k_lens, table, scale):
        cu_k = torch.zeros(len(k_lens) + 1, dtype=torch.int32, device=q.device)
        cu_k[1:] = k_lens.cumsum(0)
        return flash_attn_varlen_func(q, k_cache, v_cache, cu.int(), cu_k, int(cu.diff().max()),
                                      int(k_lens.max()), softmax_scale=scale, causal=True,
                                      block_table=table.int())
    return run


def timed(fn, iters: int, device: str) -> float:
    fn()  # warm-up: compiles and autotunes outside the timed region
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_bench(decodes: int = 64, ctx_min: int = 1024, ctx_max: int = 4096, prefill: int = 512,
              prefill_ctx: int = 1024, heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
              dtype: str = "bfloat16", iters: int = 20) -> dict[str, float]:
    """Median seconds of each implementation on one continuous-batching step, measured side by side. Each one's
    output is first checked against the torch reference (with a tolerance for its dtype), so a fast wrong kernel
    never gets a time."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    step = build_step(decodes, ctx_min, ctx_max, prefill, prefill_ctx, heads, kv_heads, head_dim, block_size,
                      torch_dtype, device)
    scale = head_dim**-0.5
    candidates = {"torch reference": lambda: ragged_paged_attention_ref(*step, scale),
                  "torch SDPA per sequence": lambda: sdpa_per_sequence(*step, scale)}
    if device == "cuda":
        candidates = {"triton": lambda: ragged_paged_attention(*step, scale, backend="triton")} | candidates
        flash = flash_attn_paged()
        if flash is not None and block_size % 256 == 0:
            candidates["flash-attn varlen paged"] = lambda: flash(*step, scale)
    expected = ragged_paged_attention_ref(*step, scale).float()
    tolerance = 1e-4 if torch_dtype == torch.float32 else 3e-2
    for name, fn in candidates.items():
        error = (fn().float() - expected).abs().max().item()
        if not error <= tolerance:
            raise AssertionError(f"{name} differs from the torch reference by {error:.3g} (> {tolerance:g})")
    results = {name: timed(fn, iters, device) for name, fn in candidates.items()}
    # The step's K/V store, for scale: one new row per query token.
    key = torch.randn(len(step[0]), kv_heads, head_dim, device=device, dtype=torch_dtype)
    slots = torch.arange(len(key), device=device)
    results["store_kv torch"] = timed(lambda: store_kv_ref(key, key, step[1], step[2], slots), iters, device)
    if device == "cuda":
        results["store_kv triton"] = timed(lambda: store_kv(key, key, step[1], step[2], slots, backend="triton"),
                                           iters, device)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--ctx-min", type=int, default=1024)
    parser.add_argument("--ctx-max", type=int, default=4096)
    parser.add_argument("--prefill", type=int, default=512, help="prefill chunk tokens")
    parser.add_argument("--prefill-ctx", type=int, default=1024, help="cached prefix + chunk of the prefill")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.dtype}: {args.decodes} decodes at context {args.ctx_min}-{args.ctx_max} + one {args.prefill}-token "
          f"prefill chunk; H_q={args.heads}, H_kv={args.kv_heads}, D={args.head_dim}, block {args.block_size}")
    with MachineLoad(torch.get_num_threads()) as machine:
        results = run_bench(**{k.replace("-", "_"): v for k, v in vars(args).items()})
    attention = {k: v for k, v in results.items() if not k.startswith("store_kv")}
    baseline_name = next(iter(attention))
    for name, seconds in attention.items():
        print(f"{name:26s} {seconds * 1e3:9.3f} ms   {seconds / attention[baseline_name]:6.2f}x the {baseline_name}")
    for name, seconds in results.items():
        if name.startswith("store_kv"):
            print(f"{name:26s} {seconds * 1e3:9.3f} ms")
    print(machine_line(machine))


if __name__ == "__main__":
    main()
