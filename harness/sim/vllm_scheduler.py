"""The simulator's continuous batching, step for step beside vLLM's own V1 scheduler.

A published burst (every request sent at once, as `vllm bench serve --request-rate inf` sends them) is scheduled
twice with the same lengths, cache blocks and caps: by the simulator's `vllm` scheduler, the front end left out, and
by vLLM's `Scheduler` class stepped with no model in vLLM's own environment (`vllm_scheduler_driver.py`). Scheduling
does not depend on step times when nothing arrives mid-run, so the two step sequences should agree: a difference is
the simulator scheduling otherwise than the engine it stands for, not a cost model's error.

    python -m harness.sim.vllm_scheduler tests/fixtures/published/gpustack/gpustack-h100-qwen3-14b-vllm-random-2k.json

Several runs given are each checked first, then stepped by vLLM in one process (its import is most of the time).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.config import server_python
from harness.core.kv_cache import EVICTION_ORDERS
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.sim.calibrate import default_params, run_replica
from harness.sim.engine_profile import fixture_engine, get_engine
from harness.sim.measured import MeasuredRun, load_measured_runs
from harness.sim.replica import simulated_engine
from harness.sim.runner import SimRunner
from strategies.continuous import ADMISSIONS
from workloads import RequestSpec

DRIVER = Path(__file__).with_name("vllm_scheduler_driver.py")
COLUMNS = ["num_prefill_tokens", "num_decode_tokens", "num_seqs", "num_preempted"]


class UnitSteps:
    """Every step takes a second: when nothing arrives mid-run, step times decide nothing a scheduler does."""

    def predict(self, shape) -> float:
        return 1.0

    def predict_many(self, shape) -> np.ndarray:  # [N]: a stretch of decode steps, its keys read growing
        return np.ones(np.broadcast(shape.num_tokens, shape.kv_tokens_read).shape)

    def overhead(self, shape, busy) -> float:
        return 0.0


def burst_of(run: MeasuredRun) -> dict:
    """`run`'s burst as both schedulers take it: its lengths, the cache blocks and caps the simulator gives its
    engine on its GPU, and prefix caching as it ran."""
    if run.max_concurrency or any(spec.arrival_s for spec in run.requests):
        raise ValueError(f"{run.name}: only a burst (every request sent at once, no max_concurrency) is scheduled "
                         "independently of step times; this run's requests arrive over time")
    if get_engine(fixture_engine(run.setup)).scheduler != "vllm":
        raise ValueError(f"{run.name}: its engine ({fixture_engine(run.setup)}) does not schedule as vLLM does")
    engine = run_replica(run, default_params(run))  # built, not run: only its cache, caps and policies are read
    return {
        "prompt_lens": [spec.prompt_len for spec in run.requests],
        "output_lens": [spec.max_new_tokens for spec in run.requests],
        "num_blocks": engine.allocator.num_blocks,
        "block_size": engine.allocator.block_size,
        "max_num_seqs": engine.strategy.max_num_seqs,
        "max_num_batched_tokens": engine.strategy.max_batch_tokens,
        "prefix_caching": run.prefix_caching,
        # As the run's engine admits and evicts (vLLM 0.10-0.19's, unless the run says otherwise).
        "admission": engine.strategy.admission,
        "eviction": engine.allocator.policy.eviction,
    }


def simulator_steps(burst: dict) -> pd.DataFrame:
    """The simulator's `vllm` scheduler's steps for `burst`, every request queued before the first step."""
    engine = build_replica("continuous", {"max_num_seqs": burst["max_num_seqs"],
                                          "max_batch_tokens": burst["max_num_batched_tokens"],
                                          "admission": burst["admission"]},
                           lambda allocator: SimRunner(UnitSteps()), num_blocks=burst["num_blocks"],
                           block_size=burst["block_size"], max_model_len=1 << 30,  # caps nothing, as the driver's
                           engine_class=simulated_engine, prefix_caching=burst["prefix_caching"],
                           scheduler="vllm", eviction=burst["eviction"])
    specs = [RequestSpec(i, 0.0, (), output_len, prompt_len) for i, (prompt_len, output_len)
             in enumerate(zip(burst["prompt_lens"], burst["output_lens"], strict=True))]
    replay([engine], specs)
    return engine.records.steps.frame()[COLUMNS].reset_index(drop=True)


def vllm_steps(bursts: list[dict], server_env: str = ".venv-vllm") -> list[pd.DataFrame]:
    """vLLM's scheduler's steps for each of `bursts`, run by the interpreter of `server_env` (where vLLM is installed):
    one process for all of them, as importing vLLM takes most of its time (8.5 s of 12 for the test's six bursts here,
    with the bytecode `scripts/install-vllm.sh` writes)."""
    python = server_python(server_env)
    if not python.is_file():
        raise FileNotFoundError(f"no vLLM environment at {python.parent.parent} (bash scripts/install-vllm.sh)")
    done = subprocess.run([str(python), str(DRIVER)], input=json.dumps(bursts), capture_output=True, text=True)
    if done.returncode:
        last = done.stderr.strip().splitlines()[-1:] or ["no message"]
        raise RuntimeError(f"vLLM's scheduler exited with code {done.returncode}: {last[0]}")
    return [pd.DataFrame(rows, columns=COLUMNS) for rows in json.loads(done.stdout)]


def step_summary(steps: pd.DataFrame) -> dict[str, int]:
    """What decides a run's time: how many steps of each kind, and the tokens they computed."""
    prefill, decode = steps.num_prefill_tokens > 0, steps.num_decode_tokens > 0
    return {"steps": len(steps), "mixed": int((prefill & decode).sum()), "prefill only": int((prefill & ~decode).sum()),
            "decode only": int((decode & ~prefill).sum()), "prefill tokens": int(steps.num_prefill_tokens.sum()),
            "decode tokens": int(steps.num_decode_tokens.sum()), "preemptions": int(steps.num_preempted.sum())}


def first_difference(ours: pd.DataFrame, theirs: pd.DataFrame) -> int | None:
    """The first step at which two schedules differ (a step only one of them has counts), or None: the same."""
    n = min(len(ours), len(theirs))
    differs = (ours.to_numpy()[:n] != theirs.to_numpy()[:n]).any(axis=1)  # [n]
    if differs.any():
        return int(differs.argmax())
    return None if len(ours) == len(theirs) else n


def compare(runs: list[MeasuredRun], server_env: str = ".venv-vllm", admission: str | None = None,
            eviction: str | None = None) -> list[tuple[pd.DataFrame, str]]:
    """Each of `runs`' bursts scheduled by both, summarised side by side (one column each), and where they first
    part; `admission` and `eviction` in place of the runs' engines'. Every run is checked before vLLM starts, and
    vLLM steps them all in one process."""
    chosen = {key: value for key, value in {"admission": admission, "eviction": eviction}.items() if value}
    bursts = [burst_of(run) | chosen for run in runs]
    return [side_by_side(simulator_steps(burst), theirs)
            for burst, theirs in zip(bursts, vllm_steps(bursts, server_env), strict=True)]


def side_by_side(ours: pd.DataFrame, theirs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Two schedules' summaries (one column each), and the step where they first part."""
    table = pd.DataFrame({"simulator": step_summary(ours), "vLLM": step_summary(theirs)})
    step = first_difference(ours, theirs)
    if step is None:
        return table, "identical step for step"
    rows = [str(steps.iloc[step].tolist()) if step < len(steps) else "no step" for steps in (ours, theirs)]
    return table, f"the two first differ at step {step} ({', '.join(COLUMNS)}): simulator {rows[0]}, vLLM {rows[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="measured bursts (vllm bench JSONs, published fixtures)")
    parser.add_argument("--vllm-env", default=".venv-vllm", help="vLLM's environment (default: .venv-vllm)")
    parser.add_argument("--admission", choices=ADMISSIONS,
                        help="when a prompt enters, in both (default: the run's engine's, next_chunk)")
    parser.add_argument("--eviction", choices=EVICTION_ORDERS,
                        help="which free block goes next, in both (default: the run's engine's, release_order)")
    args = parser.parse_args(argv)
    runs = load_measured_runs(args.runs)
    try:
        compared = compare(runs, args.vllm_env, args.admission, args.eviction)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        sys.exit(f"vllm_scheduler: {e}")
    for run, (table, verdict) in zip(runs, compared, strict=True):
        print(f"{run.name}\n{table.to_string()}\n{verdict}\n")


if __name__ == "__main__":
    main()
