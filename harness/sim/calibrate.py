"""Replay measured runs in the simulator and fit the roofline's free parameters to them.

`simulate` re-runs a measured run's workload on the simulated engine with given parameters; `relative_errors`
compares it with what was measured; `fit` chooses the parameters (compute and memory efficiency, step, per-sequence
and per-token overhead, front-end latency and serial time per request, and with runs of a mixture of experts its
expert GEMMs' efficiency) that minimise the squared log errors over a set of runs. Each engine profile in
`conf/engine/` was fitted this way to published runs of that engine (`tests/fixtures/published/`, README
"Grounding"); a run is replayed with its own engine's profile (`fixture_engine`) as the start.
"""

import argparse
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from harness.analysis import metrics
from harness.architecture import Architecture
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.layout import config_value
from harness.model_spec import described_model
from harness.sim.calibration import BOUNDS, CHAT_PARAMS, MOE_PARAMS, RooflineParams
from harness.sim.costmodel import RooflineCostModel
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.engine_profile import EngineProfile, fixture_engine, front_end, get_engine
from harness.sim.measured import MeasuredRun, MeasuredRunError, load_measured_runs
from harness.sim.replica import simulated_engine
from harness.sim.runner import SimRunner

BLOCK_SIZE = 16  # vLLM's default
# What a fit matches, each counted alike: throughput, TPOT, end-to-end latency and TTFT.
WEIGHTS = {"output_throughput_tps": 1.0, "tpot_s_p50": 1.0, "e2e_s_mean": 1.0, "ttft_s_p50": 1.0}


@functools.cache
def _described(model: str, hardware: str, quantization: str, kv_dtype: str):
    """A run's model and hardware, the same in every simulation of a fit: read (or, for `cpu`, measured) once. A
    measurement taken anew for each trial would also move the loss under the search."""
    config = described_model(model)
    return config, Architecture.from_config(config, 2, quantization, kv_dtype), get_hardware(hardware)  # bfloat16


def run_architecture(run: MeasuredRun) -> Architecture:
    """The model a run served, in the formats it served it in."""
    return _described(run.model, run.hardware, run.quantization, run.kv_cache_dtype)[1]


@functools.cache
def _profile(name: str) -> EngineProfile:
    """An engine profile of the catalogue, read once: a fit simulates thousands of times."""
    return get_engine(name)


def run_replica(run: MeasuredRun, params: RooflineParams):
    """The simulated engine that replays `run` with `params` (its engine's profile, the figures replaced): its cost
    model, caps and cache as the run's GPU gives them, nothing run yet."""
    config, arch, hardware = _described(run.model, run.hardware, run.quantization, run.kv_cache_dtype)
    profile = _profile(fixture_engine(run.setup)).overridden(asdict(params))
    if "async_scheduling" in run.setup:
        profile = profile.overridden({"async_scheduling": bool(run.setup["async_scheduling"])})
    if "scheduler_recv_interval" in run.setup:  # its SGLang's launch flag
        profile = profile.overridden({"scheduler_recv_interval": int(run.setup["scheduler_recv_interval"])})
    costs = RooflineCostModel(arch, hardware, profile, params.compute_efficiency, run.tensor_parallel,
                              run.expert_parallel)
    default_seqs, default_tokens = hardware.serving_defaults
    # A model with linear-attention layers: vLLM's larger block, and each sequence's state; with window layers, theirs.
    block = costs.hybrid_block_size(BLOCK_SIZE)
    state_blocks = costs.state_blocks(block)
    window = costs.window_blocks(block)
    most_side_blocks = state_blocks + (window.held(window.max_blocks) if window else 0)
    options = {
        "max_num_seqs": run.max_num_seqs or default_seqs,
        "max_batch_tokens": run.max_num_batched_tokens or default_tokens,
        "order": run.setup.get("order", "decode_first"),
    }
    return build_replica(
        "continuous",
        options,
        lambda allocator: SimRunner(costs),
        # No more blocks than all the requests together could hold (and one for each sequence the engine may run,
        # which it asks for): the same simulation, without a table of millions of free blocks (a CPU's memory, a
        # tiny model) built for every trial.
        num_blocks=min(costs.num_kv_blocks(block, run.memory_fraction,
                                           (options["max_num_seqs"], options["max_batch_tokens"])),
                       max(options["max_num_seqs"], sum(-(-(spec.prompt_len + spec.max_new_tokens) // block)
                                                        + most_side_blocks for spec in run.requests))),
        block_size=block,
        max_model_len=run.setup.get("max_model_len") or config["max_position_embeddings"],
        engine_class=simulated_engine,
        prefix_caching=run.prefix_caching and not state_blocks,  # not modelled beside a state
        scheduler=profile.scheduler,
        eviction=run.eviction,
        recv_interval=profile.scheduler_recv_interval,
        state_blocks=state_blocks,
        window=window,
    )


def simulate(run: MeasuredRun, params: RooflineParams) -> dict:
    """The run's summary as the simulator predicts it with `params` (its engine's profile, the figures replaced)."""
    engine = run_replica(run, params)
    model_type = config_value(_described(run.model, run.hardware, run.quantization, run.kv_cache_dtype)[0],
                              "model_type", "")
    served = front_end(params, run.endpoint, model_type, _profile(fixture_engine(run.setup)).frontend_batches)
    if run.host_frontend_s is not None:  # what its deployment's front end showed, in place of the profile's
        served["frontend_service_s"] = run.host_frontend_s
    replay([engine], run.requests, max_concurrency=run.max_concurrency, **(served if run.served_over_http else {}))
    records = engine.records
    requests = metrics.requests_table(records)
    # Read the prediction as the run was measured: what the benchmark counted as TTFT 0 counts as 0 here too.
    requests.loc[requests.request_id.isin(run.zero_ttft_requests), "ttft_s"] = 0.0
    return metrics.summarize(
        requests,
        metrics.steps_table(records, engine.allocator.num_blocks),
        metrics.inter_token_latencies([records]),
        {},
    )


def relative_errors(run: MeasuredRun, predicted: dict, keys: Iterable[str] = WEIGHTS) -> dict[str, float]:
    """(predicted - measured) / measured for every metric of `keys` (by default those a fit matches) both have."""
    return {
        key: (predicted[key] - measured) / measured
        for key, measured in run.metrics.items()
        if key in keys and measured and predicted.get(key) is not None and not math.isnan(predicted[key])
    }


def error_loss(errors: Iterable[dict[str, float]]) -> float:
    """Mean weighted squared log error over the matched metrics of each run's relative `errors`."""
    total = weight = 0.0
    for run_errors in errors:
        for key, error in run_errors.items():
            total += WEIGHTS[key] * math.log1p(max(error, -0.99)) ** 2
            weight += WEIGHTS[key]
    return total / weight


def loss(runs: list[MeasuredRun], params: RooflineParams) -> float:
    return error_loss(relative_errors(run, simulate(run, params)) for run in runs)


def bounded_search(start, bounds: dict[str, tuple[float, float]], loss_of: Callable, max_evaluations: int,
                   max_rounds: int = 1):
    """The figures named in `bounds` of the dataclass `start` that minimise `loss_of(candidate)`, and that loss: a
    bounded Powell search from `start` in coordinates scaled to each figure's range (an efficiency and a
    per-sequence overhead differ by 10^4), restarted from its own answer (up to `max_rounds` searches of
    `max_evaluations` evaluations) while a restart still gains 5% (our threshold). A search that ends worse than
    where it started (scipy's bounded Powell can: fitting the `sglang` profile once ended at a loss of 0.068 from a
    start of 0.063) gives the start back."""
    from scipy.optimize import minimize

    names = list(bounds)
    low, high = (np.array([bounds[name][i] for name in names]) for i in (0, 1))

    def candidate(x: np.ndarray):
        values = low + np.clip(x, 0.0, 1.0) * (high - low)
        return replace(start, **{name: float(v) for name, v in zip(names, values)})

    x = np.clip((np.array([getattr(start, name) for name in names]) - low) / (high - low), 0.0, 1.0)
    start_loss = loss_of(candidate(x))
    best = math.inf
    for _ in range(max_rounds):
        result = minimize(lambda x: loss_of(candidate(x)), x, method="Powell", bounds=[(0.0, 1.0)] * len(x),
                          options={"xtol": 1e-3, "ftol": 1e-4, "maxfev": max_evaluations})
        gained = best - result.fun
        if result.fun < best:
            x, best = result.x, float(result.fun)
        if gained < 0.05 * best:
            break
    return (candidate(x), best) if best <= start_loss else (start, start_loss)


def screened_start(start, bounds: dict[str, tuple[float, float]], loss_of: Callable):
    """A second start for a local search, from `start`: each group of figures in `SCREEN_GROUPS` in turn scaled
    together by the best of `SCREEN_FACTORS` (within `bounds`), the others held, in two passes (25 simulations of the
    runs). An engine profile fitted on GPUs can be far off on a machine whose host work outweighs its model: on three
    of vLLM's runs here (loops of 1, 4 and 16) the V1 profile's loss is 0.40; this screen finds host figures x3 and
    front end x0.1, at 0.045."""
    best, best_loss = start, loss_of(start)
    groups = [[name for name in group if name in bounds] for group in SCREEN_GROUPS]
    for _ in range(2):
        for group in groups:
            base = best
            for factor in SCREEN_FACTORS:
                candidate = replace(base, **{name: float(np.clip(getattr(base, name) * factor, *bounds[name]))
                                             for name in group})
                if candidate == base:  # every figure of the group at a bound already
                    continue
                value = loss_of(candidate)
                if value < best_loss:
                    best, best_loss = candidate, value
    return best


def fit(runs: list[MeasuredRun], start: RooflineParams, max_evaluations: int = 400,
        max_rounds: int = 2) -> tuple[RooflineParams, float]:
    """The parameters that best reproduce `runs`, and their loss: the better of two `bounded_search`es, one from
    `start` and one from its best screened variant (`screened_start`), where that differs. Neither start is always
    the better: a simulated run's loss moves in steps as a parameter crosses a scheduling event, and a local search
    stops in whichever basin it starts in (one repeat each of vLLM's loops of 1, 4 and 16 here: 0.00069 from the V1
    profile, 0.0023 from its screened variant; when those runs were first fitted, 0.0007 and 0.00032). Each search
    restarts from its own answer once by default: Powell's search directions collapse along a valley of parameters
    that trade for each other (a step's host time against its weights' reading; on an earlier sweep of vLLM's runs
    here one search stopped at a loss of 0.085, its restart reached 0.021). The expert GEMMs' figures are searched
    only when some run served a mixture of experts, the chat endpoint's latency only when some run was sent to it."""
    bounds = {name: tuple(limits) for name, limits in asdict(BOUNDS).items() if name in pinned_params(runs)}
    return two_start_search(start, bounds, functools.partial(loss, runs), max_evaluations, max_rounds)


def two_start_search(start, bounds: dict[str, tuple[float, float]], loss_of: Callable, max_evaluations: int,
                     max_rounds: int = 2):
    """The better of two `bounded_search`es of the dataclass `start` (`fit`'s, and an engine profile's fit across
    GPUs): one from `start`, one from its screened variant where that differs."""
    # Memoized: the searches evaluate their starts again, and the screen's second pass points of its first.
    loss_of = functools.cache(loss_of)
    starts = dict.fromkeys([start, screened_start(start, bounds, loss_of)])  # one search if the screen kept `start`
    return min((bounded_search(s, bounds, loss_of, max_evaluations, max_rounds) for s in starts),
               key=lambda found: found[1])


def pinned_params(runs: list[MeasuredRun]) -> set[str]:
    """The figures `runs` can pin: the expert GEMMs' only with a mixture of experts among them, the chat endpoint's
    latency only with a run sent to it."""
    moe = any(run_architecture(run).num_experts for run in runs)
    chat = any(run.endpoint == "chat" for run in runs)
    return {name for name in asdict(BOUNDS) if (moe or name not in MOE_PARAMS) and (chat or name not in CHAT_PARAMS)}


def profile_params(run: MeasuredRun, engine: EngineProfile) -> RooflineParams:
    """The figures `run` is replayed with under `engine`: the engine's, with the compute share its GPU class reaches
    in that engine (the hardware class's figure scaled by the engine's)."""
    figures = {name: getattr(engine, name) for name in asdict(BOUNDS) if name != "compute_efficiency"}
    return RooflineParams(engine.compute_efficiency_on(get_hardware(run.hardware)), **figures)


def default_params(run: MeasuredRun) -> RooflineParams:
    """The figures the simulator replays `run` with by default: its own engine's profile (`conf/engine/`)."""
    return profile_params(run, _profile(fixture_engine(run.setup)))


def error_table(runs: list[MeasuredRun], predicted: list[dict], role: str) -> pd.DataFrame:
    """One row per run: its relative error per matched metric (`predicted`: `simulate` of each run)."""
    return pd.DataFrame([{"run": run.name, "role": role, **relative_errors(run, prediction)}
                         for run, prediction in zip(runs, predicted)])


def repeat_table(runs: list[MeasuredRun], predicted: list[dict], role: str) -> pd.DataFrame:
    """One row per load measured more than once (run folders in one folder: `concurrency-4/seed-1`, `-2`, ...):
    the prediction (`predicted`: `simulate` of each run) against the median of the repeats, each metric apart. On a
    machine whose speed drifts between runs the median is what a prediction should meet; each run's own error is
    its noise as much as the model's."""
    groups: dict[str | None, list[tuple[MeasuredRun, dict]]] = {}
    for run, prediction in zip(runs, predicted):
        groups.setdefault(run.load, []).append((run, prediction))
    rows = []
    for load, repeats in groups.items():
        if not load or len(repeats) < 2:
            continue
        row = {"load": load, "role": role, "repeats": len(repeats)}
        for key in WEIGHTS:
            measured = [run.metrics[key] for run, _ in repeats if run.metrics.get(key)]
            if measured:
                row[key] = float(np.median([p[key] for _, p in repeats])) / float(np.median(measured)) - 1
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Fit the simulator to measured runs (vllm bench serve --save-result --save-detailed JSONs with "
                    "a setup block naming the GPU and model) and report its error on runs left out of the fit.")
    parser.add_argument("runs", nargs="+", help="measured runs to fit: vllm bench JSONs, this harness's run folders, "
                                                "or folders of either")
    parser.add_argument("--hold-out", nargs="*", default=[], help="runs to predict, not fitted")
    parser.add_argument("--out", type=Path, default=Path("results") / "calibration.yaml")
    parser.add_argument("--evaluations", type=int, default=300,
                        help="the budget of simulations of the run set for one search")
    parser.add_argument("--rounds", type=int, default=2, help="searches at most, each restarted from the last's answer")
    parser.add_argument("--setup", nargs="*", default=[], metavar="KEY=VALUE",
                        help="what run folders do not say (over their setup.yaml): hardware=h100 model=llama-3.1-8b "
                             "tensor_parallel=2 max_num_seqs=16 async_scheduling=false (vLLM on a CPU) ...")
    args = parser.parse_args()
    try:
        setup = parse_setup(args.setup)
        fitted, held_out = load_measured_runs(args.runs, setup), load_measured_runs(args.hold_out, setup)
    except MeasuredRunError as e:
        raise SystemExit(f"error: {e}") from None
    start = default_params(fitted[0])
    params, value = fit(fitted, start, args.evaluations, args.rounds)
    roles = [(fitted, "fitted"), (held_out, "held out")]
    predicted = [[simulate(run, params) for run in runs] for runs, _ in roles]  # once each, for both tables
    table = pd.concat([error_table(runs, p, role) for (runs, role), p in zip(roles, predicted)])
    worst = table.drop(columns=["run", "role"]).abs().max(axis=None)
    if value > CONVERGED_LOSS:
        raise SystemExit(f"error: the fit did not converge: its best parameters still miss by up to {worst:.0%} "
                         f"(mean squared log error {value:.3f}); are these runs of one GPU, model and engine?")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump({
        "params": asdict(params), "fitted_on": [run.source for run in fitted],
        "loss": value, "errors": table.set_index("run").round(4).to_dict(orient="index")}, sort_keys=False))
    print(table.to_string(index=False, float_format=lambda x: f"{x:+.1%}"))
    repeats = pd.concat([repeat_table(runs, p, role) for (runs, role), p in zip(roles, predicted)])
    if len(repeats):
        print("\nloads measured more than once: the prediction against the median of the repeats")
        print(repeats.to_string(index=False, float_format=lambda x: f"{x:+.1%}"))
    print(f"calibration: {args.out}  (use it: runner=sim runner.calibration={args.out})")


def parse_setup(pairs: list[str]) -> dict:
    """`key=value` pairs; numbers become numbers."""
    setup = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise MeasuredRunError(f"--setup takes key=value pairs, got {pair!r}")
        setup[key] = yaml.safe_load(value)
    return setup


# What `screened_start` scales together, and by how much: the host's figures (its time a step, a sequence, a token),
# the hardware's shares of peak, the front end's figures.
SCREEN_GROUPS = (("step_overhead_s", "seq_overhead_s", "token_overhead_s"),
                 ("compute_efficiency", "compute_scale", "fa2_compute_scale", "memory_efficiency"),
                 ("frontend_latency_s", "frontend_service_s"))
SCREEN_FACTORS = (0.1, 0.3, 3.0, 10.0)

# A fit whose mean squared log error stays above this (about 30% off on average) describes no system.
CONVERGED_LOSS = 0.07

if __name__ == "__main__":
    main()
