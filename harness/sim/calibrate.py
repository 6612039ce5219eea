"""Replay measured runs in the simulator and fit the roofline's free parameters to them.

`simulate` re-runs a measured run's workload on the simulated engine with given parameters; `relative_errors`
compares it with what was measured; `fit` chooses the parameters (compute and memory efficiency, step and
per-sequence overhead, front-end latency and serial time per request) that minimise the squared log errors over a
set of runs. The simulator's defaults were chosen this way from published runs (`tests/fixtures/published/`,
README "Grounding").
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

from harness.analysis import metrics
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.model_spec import Architecture, described_model
from harness.sim.costmodel import RooflineCostModel
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.engine import SimEngine
from harness.sim.measured import MeasuredRun
from harness.sim.runner import SimRunner

BLOCK_SIZE = 16  # vLLM's default
# What a fit matches, each counted alike: throughput, TPOT, end-to-end latency and TTFT.
WEIGHTS = {"output_throughput_tps": 1.0, "tpot_s_p50": 1.0, "e2e_s_mean": 1.0, "ttft_s_p50": 1.0}


@dataclass(frozen=True)
class RooflineParams:
    compute_efficiency: float | None  # None: each run's hardware file's figure
    memory_efficiency: float
    step_overhead_s: float
    seq_overhead_s: float
    frontend_latency_s: float
    frontend_service_s: float


def simulate(run: MeasuredRun, params: RooflineParams) -> dict:
    """The run's summary as the simulator predicts it with `params`."""
    config = described_model(run.model)
    arch = Architecture.from_config(config, 2)  # bfloat16
    hardware = get_hardware(run.hardware)
    costs = RooflineCostModel(
        arch,
        hardware,
        params.compute_efficiency,
        params.memory_efficiency,
        params.step_overhead_s,
        params.seq_overhead_s,
    )
    default_seqs, default_tokens = hardware.serving_defaults
    options = {
        "max_num_seqs": run.max_num_seqs or default_seqs,
        "max_batch_tokens": run.max_num_batched_tokens or default_tokens,
        "order": run.setup.get("order", "decode_first"),
    }
    engine = build_replica(
        "continuous",
        options,
        lambda allocator: SimRunner(costs),
        num_blocks=costs.num_kv_blocks(BLOCK_SIZE, run.memory_fraction),
        block_size=BLOCK_SIZE,
        max_model_len=config["max_position_embeddings"],
        engine_class=SimEngine,
    )
    replay(
        [engine],
        run.requests,
        max_concurrency=run.max_concurrency,
        frontend_latency_s=params.frontend_latency_s if run.served_over_http else 0.0,
        frontend_service_s=params.frontend_service_s if run.served_over_http else 0.0,
    )
    records = engine.records
    return metrics.summarize(
        metrics.requests_table(records),
        metrics.steps_table(records, engine.allocator.num_blocks),
        metrics.inter_token_latencies(records),
        {},
    )


def relative_errors(run: MeasuredRun, predicted: dict) -> dict[str, float]:
    """(predicted - measured) / measured for every metric both have that a fit matches."""
    return {
        key: (predicted[key] - measured) / measured
        for key, measured in run.metrics.items()
        if key in WEIGHTS and measured and predicted.get(key) is not None and not math.isnan(predicted[key])
    }


def loss(runs: list[MeasuredRun], params: RooflineParams) -> float:
    """Mean weighted squared log error over every run's matched metrics."""
    total = weight = 0.0
    for run in runs:
        for key, error in relative_errors(run, simulate(run, params)).items():
            total += WEIGHTS[key] * math.log1p(max(error, -0.99)) ** 2
            weight += WEIGHTS[key]
    return total / weight


# The range each parameter may take: physical limits, wide enough for any engine we have seen.
BOUNDS = RooflineParams(
    compute_efficiency=(0.05, 1.0),
    memory_efficiency=(0.05, 1.0),
    step_overhead_s=(0.0, 0.01),
    seq_overhead_s=(0.0, 1e-4),
    frontend_latency_s=(0.0, 0.1),
    frontend_service_s=(0.0, 0.02),
)


def fit(runs: list[MeasuredRun], start: RooflineParams, max_evaluations: int = 400) -> tuple[RooflineParams, float]:
    """The parameters that best reproduce `runs`, and their loss: a bounded Powell search from `start`, in
    coordinates scaled to each parameter's range (an efficiency and a per-sequence overhead differ by 10^4)."""
    from scipy.optimize import minimize

    low, high = (np.array([b[i] for b in asdict(BOUNDS).values()]) for i in (0, 1))

    def params(x: np.ndarray) -> RooflineParams:
        return RooflineParams(*[float(v) for v in low + np.clip(x, 0.0, 1.0) * (high - low)])

    x0 = (np.array(list(asdict(start).values())) - low) / (high - low)
    result = minimize(
        lambda x: loss(runs, params(x)),
        np.clip(x0, 0.0, 1.0),
        method="Powell",
        bounds=[(0.0, 1.0)] * len(x0),
        options={"xtol": 1e-3, "ftol": 1e-4, "maxfev": max_evaluations},
    )
    return params(result.x), float(result.fun)
