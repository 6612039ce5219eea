"""How fast the simulator runs: `python -m harness.sim.bench [--requests N] [--e2e-requests M]`.

Not a test: it prints simulated requests per second of wall time (the replay alone, each strategy, continuous
batching as vLLM and as SGLang schedule it, at low and high load, on 1 and 8 replicas: ShareGPT-profile requests,
Llama-2-7B on H100s by the roofline, 256 concurrent requests a replica), the roofline's time to predict one step
alone and in a stretch, then the wall time of a whole `python -m harness runner=sim ...` run of M requests,
workload, tables, plots and report included.
"""

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from harness.config import compose_config, validate
from harness.core.replay import replay
from harness.machine_load import MachineLoad, machine_line
from harness.sim.costmodel import StepShape
from harness.sim.replica import simulated_replicas
from workloads.traces import load_azure

SETUP = ["runner=sim", "runner.hardware=h100", "model=llama-2-7b", "concurrency=256", "progress=false"]
LOADS = {"low": 5.0, "high": 40.0}  # requests/s a replica: well under, and well over, what one H100 serves
# What each row runs: a strategy, and for continuous batching the schedule of the engine profile that it runs with.
SCHEDULES = {"static": ("static", []), "dynamic": ("dynamic", []), "continuous": ("continuous", []),
             "sglang": ("continuous", ["runner.engine=sglang"])}


def replay_rate(schedule: str, rate: float, replicas: int, requests: int) -> tuple[float, int]:
    """Simulated requests per second of wall time, and steps simulated."""
    strategy, engine = SCHEDULES[schedule]
    overrides = [*SETUP, f"strategy={strategy}", *engine, f"workload.num_requests={requests}", f"workload.rate={rate}",
                 f"runner.replicas={replicas}", "runner.router=least_outstanding"]
    if strategy == "continuous":
        overrides.append("strategy.max_batch_tokens=2048")
    cfg = validate(compose_config(overrides))
    engines, route, workload, _, _ = simulated_replicas(cfg)
    start = time.perf_counter()
    replay(engines, workload.requests, route)
    wall = time.perf_counter() - start
    return requests / wall, sum(len(e.records.steps) for e in engines)


def prediction_time(num_steps: int) -> tuple[float, float]:
    """Seconds per step the roofline takes to predict `num_steps` steps one at a time (as a replay predicts most) and
    as one stretch of arrays (as it predicts a decode stretch): 1-256 decoders over 100-4,000 keys each, half of the
    steps with a prompt chunk of up to 2,048 tokens beside them."""
    engines, *_ = simulated_replicas(validate(compose_config([*SETUP, "strategy=continuous",
                                                              "workload.num_requests=1"])))
    costs = engines[0].runner.cost_model
    rng = np.random.default_rng(0)
    steps = []
    for decoders, context, prompt in zip(rng.integers(1, 257, num_steps).tolist(),
                                         rng.integers(100, 4001, num_steps).tolist(),
                                         (rng.integers(0, 2, num_steps) * rng.integers(1, 2049, num_steps)).tolist()):
        keys = decoders * context
        steps.append(StepShape(False, decoders + prompt, decoders + (prompt > 0), keys + prompt * prompt,
                               keys + prompt, decoders + (prompt > 0), keys, prompt * (prompt - 1) // 2))
    names = [field.name for field in dataclasses.fields(StepShape)]
    stretch = StepShape(*(np.array([getattr(step, name) for step in steps]) for name in names))
    start = time.perf_counter()
    for step in steps:
        costs.predict(step)
    alone = (time.perf_counter() - start) / num_steps
    start = time.perf_counter()
    costs.predict_many(stretch)
    return alone, (time.perf_counter() - start) / num_steps


def end_to_end(requests: int) -> float:
    """Wall seconds of a whole simulated run of `requests` continuous-batching requests, in a fresh process."""
    command = [sys.executable, "-m", "harness", *SETUP, "strategy=continuous", "workload=sharegpt",
               f"workload.num_requests={requests}", f"workload.rate={LOADS['high']}", "results.tables=parquet",
               "results.steps=summary", f"hydra.run.dir=results/bench/e2e_{requests}"]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def trace_load(rows: int) -> float:
    """Wall seconds to load an Azure-2024-format trace of `rows` rows (made up here: ISO timestamps, lengths)."""
    rng = np.random.default_rng(0)
    stamps = pd.Timestamp("2024-05-10") + pd.to_timedelta(np.cumsum(rng.exponential(0.1, rows)), unit="s")
    table = pd.DataFrame({"TIMESTAMP": stamps.strftime("%Y-%m-%d %H:%M:%S.%f"),
                          "ContextTokens": rng.integers(1, 8000, rows), "GeneratedTokens": rng.integers(1, 800, rows)})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "azure.csv"
        table.to_csv(path, index=False)
        start = time.perf_counter()
        load_azure(str(path))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="requests a replica, per measurement")
    parser.add_argument("--e2e-requests", type=int, default=1_000_000, help="0 to skip the whole run")
    parser.add_argument("--trace-rows", type=int, default=1_000_000, help="0 to skip the trace load")
    parser.add_argument("--predicted-steps", type=int, default=100_000, help="0 to skip timing the prediction")
    args = parser.parse_args()
    print(f"simulated requests per second of wall time ({args.requests} ShareGPT-profile requests a replica)")
    print(f"{'strategy':10s} {'load':5s} {'replicas':>8s} {'req/s':>9s} {'steps':>9s}")
    with MachineLoad(run_cores=1) as machine:  # the simulator is one Python thread
        for schedule in SCHEDULES:
            for load, rate in LOADS.items():
                for replicas in (1, 8):
                    speed, steps = replay_rate(schedule, rate * replicas, replicas, args.requests * replicas)
                    print(f"{schedule:10s} {load:5s} {replicas:8d} {speed:9.0f} {steps:9d}", flush=True)
        if args.predicted_steps:
            alone, in_stretch = prediction_time(args.predicted_steps)
            print(f"one step's cost predicted ({args.predicted_steps} steps): {alone * 1e6:.2f} µs alone, "
                  f"{in_stretch * 1e6:.3f} µs in a stretch of them ({alone / in_stretch:.0f} times less)")
        if args.trace_rows:
            print(f"Azure-format trace of {args.trace_rows} rows loaded in {trace_load(args.trace_rows):.1f} s")
        if args.e2e_requests:
            wall = end_to_end(args.e2e_requests)
            print(f"end to end: {args.e2e_requests} requests (continuous, high load, one replica), workload to "
                  f"report: {wall:.0f} s wall")
    print(machine_line(machine))


if __name__ == "__main__":
    main()
