"""How fast the simulator runs: `python -m harness.sim.bench [--requests N]`.

Simulates ShareGPT-like requests at high load (Llama-2-7B on an H100, roofline, 256 concurrent requests) with
each strategy and prints simulated requests per second of wall time, timing the engine's replay alone.
"""

import argparse
import time

from harness.config import compose_config, validate
from harness.core.replica import build_replica
from harness.model_spec import Architecture, read_model_config
from harness.sim.costmodel import build_cost_model
from harness.sim.engine import SimEngine
from harness.sim.runner import SimRunner
from workloads import build_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=40.0, help="Poisson requests/s (high load for an H100)")
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    cfg = compose_config(["runner=sim", "runner.hardware=h100", "model=llama-2-7b",
                          f"workload.num_requests={args.requests}", f"workload.rate={args.rate}",
                          f"concurrency={args.concurrency}", "strategy.max_batch_tokens=2048"])
    run = validate(cfg)
    config = read_model_config(run.model)
    costs = build_cost_model(run.runner, Architecture.from_config(config, 2))  # the simulator's defaults
    workload = build_workload(cfg.workload, config["vocab_size"])
    output_tokens = sum(r.max_new_tokens for r in workload.requests)
    print(f"{args.requests} ShareGPT-profile requests ({output_tokens} output tokens) at {args.rate} req/s, "
          f"Llama-2-7B on an H100 (roofline), concurrency {args.concurrency}")
    for name in ("static", "dynamic", "continuous"):
        budget = ["strategy.max_batch_tokens=2048"] if name == "continuous" else []
        strategy = validate(compose_config([f"strategy={name}", f"concurrency={args.concurrency}", *budget])).strategy
        options = strategy.model_dump(exclude={"name"})
        engine = build_replica(name, options, lambda allocator: SimRunner(costs),
                               num_blocks=costs.num_kv_blocks(16, 0.9), block_size=16,
                               max_model_len=config["max_position_embeddings"], engine_class=SimEngine)
        start = time.perf_counter()
        records = engine.run(workload.requests)
        wall = time.perf_counter() - start
        print(f"{name:10s} {len(records.requests) / wall:8.0f} simulated requests/s   {len(records.steps) / wall:8.0f}"
              f" steps/s   ({len(records.steps)} steps in {wall:.2f} s, {engine.clock:.0f} s simulated)")


if __name__ == "__main__":
    main()
