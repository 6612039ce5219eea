"""Calibrate the simulator on this machine: `python -m harness.sim.step_profile [overrides] [--out CSV] [--quick]`.

Runs the real runner over a grid of step shapes — tokens per step × keys per token, ragged and padded — and
writes the measured durations as a CSV for `runner=sim runner.profile=<csv>`, with the environment and the
harness's own per-step overhead recorded in `# key: value` lines at its top.
"""

import argparse
import math
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from harness.analysis.results import write_text
from harness.config import compose_config, validate
from harness.core.kv_cache import BlockAllocator
from harness.core.replica import build_replica
from harness.environment import environment
from harness.real.model import load_model, resolve_device, resolve_dtype
from harness.real.runner import RealRunner
from strategies import BatchPlan, Request, ScheduledChunk
from workloads import RequestSpec

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
CONTEXTS = (1, 64, 256, 512, 768, 1024, 1536, 2047)
QUICK_TOKENS, QUICK_CONTEXTS = (1, 4, 16, 64), (1, 32, 128)
WARMUPS = 3
ROWS = 16  # sequences (ragged) or rows (padded) in the grid's steps, like the default concurrency


def grid_plan(num_tokens: int, context: int, padded: bool) -> BatchPlan | None:
    """A step of `num_tokens` tokens whose queries see `context` keys each on average; None if impossible.

    Ragged: up to 16 decodes, and past 16 tokens 15 decodes plus one prefill chunk (the shape continuous
    batching runs). Padded: min(tokens, 16) rows of equal width. Every sequence has `context` cached keys.
    """
    if padded or num_tokens <= ROWS:
        rows = min(num_tokens, ROWS)
        chunk_lens = [num_tokens // rows] * rows
    else:
        chunk_lens = [1] * (ROWS - 1) + [num_tokens - ROWS + 1]
    if max(chunk_lens) > context:
        return None  # a chunk's own tokens are keys too: fewer keys than that cannot be
    chunks = []
    for i, q in enumerate(chunk_lens):
        request = Request(request_id=i, arrival_s=0.0, token_ids=[(7 * i + j) % 1000 for j in range(context)],
                          num_prompt_tokens=context, max_new_tokens=1)
        chunks.append(ScheduledChunk(request, context - q, q))
    return BatchPlan(chunks=chunks, padded=padded)


def measure(runner: RealRunner, allocator: BlockAllocator, plan: BatchPlan, repeats: int) -> float:
    for chunk in plan.chunks:
        if not allocator.allocate(chunk.request, chunk.request.num_tokens):
            raise RuntimeError("the profile's cache is too small for its own grid")
    try:
        # A new shape runs slower for its first few calls (the CPU kernels pick and cache their plans), while a
        # serving run repeats a shape step after step: warm up several times, then take the median.
        for _ in range(WARMUPS):
            runner.execute(plan)
        return statistics.median(runner.execute(plan).duration_s for _ in range(repeats))
    finally:
        for chunk in plan.chunks:
            allocator.free(chunk.request)


def step_overhead(model, kernel_backend: str, block_size: int) -> float:
    """The engine's own time per step (scheduling, bookkeeping) on a small real replay."""
    engine = build_replica("continuous", dict(max_batch_tokens=64, max_num_seqs=8),
                           lambda allocator: RealRunner(model, allocator, kernel_backend=kernel_backend),
                           num_blocks=64, block_size=block_size, max_model_len=4096)
    specs = [RequestSpec(i, 0.0, tuple(range(1, 9 + i)), 24) for i in range(8)]
    records = engine.run(specs)
    steps = records.steps
    return float(np.median(steps.column("duration_s") - steps.column("busy_s")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: model, device, dtype, kv_cache.block_size")
    parser.add_argument("--out", type=Path, help="default results/profiles/<model>_<host>.csv")
    parser.add_argument("--quick", action="store_true", help="a small grid (seconds), for tests")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each shape, after warm-ups")
    args = parser.parse_args()
    cfg = validate(compose_config(args.overrides))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device.type)
    model, _ = load_model(cfg.model, device, dtype)
    tokens, contexts = (QUICK_TOKENS, QUICK_CONTEXTS) if args.quick else (TOKENS, CONTEXTS)
    contexts = [min(c, model.config.max_position_embeddings - 1) for c in contexts]
    block_size = cfg.kv_cache.block_size
    allocator = BlockAllocator(ROWS * math.ceil(max(contexts) / block_size) + 8, block_size)
    runner = RealRunner(model, allocator, kernel_backend=cfg.kernel_backend)
    runner.warm_up()
    rows = ["layout,num_tokens,mean_context,duration_s"]
    start = time.perf_counter()
    for padded in (False, True):
        for num_tokens in tokens:
            for context in contexts:
                plan = grid_plan(num_tokens, context, padded)
                if plan is not None:
                    seconds = measure(runner, allocator, plan, args.repeats)
                    layout = "padded" if padded else "ragged"
                    rows.append(f"{layout},{num_tokens},{context},{seconds:.6e}")
    overhead = step_overhead(model, cfg.kernel_backend, block_size)
    header = {"model": cfg.model.name, "host": platform.node(), "block_size": block_size,
              "step_overhead_s": f"{overhead:.6e}", "profile_seconds": f"{time.perf_counter() - start:.1f}"}
    header |= environment(str(device), str(dtype))
    out = args.out or Path("results") / "profiles" / f"{cfg.model.name}_{platform.node() or 'host'}.csv"
    write_text(out, "".join(f"# {k}: {v}\n" for k, v in header.items()) + "\n".join(rows) + "\n")
    print(f"{len(rows) - 1} step shapes measured in {header['profile_seconds']} s; step overhead "
          f"{overhead * 1e3:.2f} ms; profile: {out}")


if __name__ == "__main__":
    main()
