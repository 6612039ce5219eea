"""One job: config → workload, replicas (cache, strategy, runner) → replay → tables, summary, report on disk.

The composition root: it imports the real runner (torch, transformers) only for `runner=real`.
"""

import contextlib
import logging
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from harness.analysis import metrics
from harness.analysis.results import RunInterrupted, write_csv
from harness.analysis.run_files import finish_run
from harness.config import PEERS, ConfigError, RunConfig, validate
from harness.core.engine import Engine
from harness.core.replay import replay
from harness.environment import environment
from harness.layout import config_value
from harness.machine_load import MachineLoad, measurement
from harness.model_spec import read_model_config
from harness.run_parts import configured_replica, device_caps, device_num_blocks, largest_step, load_workload
from harness.sim.engine_profile import configured_engine, front_end
from harness.sim.replica import simulated_replicas

log = logging.getLogger(__name__)


def run_job(raw: DictConfig, run_dir: Path) -> dict:
    """Run the job `raw` (a composed Hydra config) describes, writing its results into `run_dir`."""
    cfg = validate(raw)
    if cfg.runner.name in PEERS:
        from harness.peers.job import run_peer  # transformers' engines or a server: their own clock

        return run_peer(cfg, raw, run_dir)
    build = _real_replicas if cfg.runner.name == "real" else simulated_replicas
    replicas, route, workload, device, dtype = build(cfg)
    load = _machine_load(cfg)
    try:
        with load or contextlib.nullcontext():
            replay(replicas, workload.requests, route, progress=cfg.progress, desc=cfg.strategy.name,
                   max_concurrency=cfg.workload.max_concurrency, **_front_end(cfg))
    except RunInterrupted as stop:
        interrupted = stop  # write what was measured, marked partial, then let the entry point say so
    else:
        interrupted = None
        for engine in replicas:
            if engine.allocator.num_used_blocks:
                raise RuntimeError(f"{engine.allocator.num_used_blocks} KV blocks still held after the run: a leak")

    labels = {"strategy": cfg.strategy.name, "workload": workload.name, "runner": cfg.runner.name,
              "model": cfg.model.name, "workload_source": workload.info.get("source", ""),
              "arrival": cfg.workload.arrival, "rate": cfg.workload.rate,
              "concurrency": replicas[0].strategy.max_concurrency, "max_concurrency": cfg.workload.max_concurrency,
              "engine_caps": replicas[0].caps_source, "num_blocks": replicas[0].allocator.num_blocks,
              "block_size": replicas[0].allocator.block_size,
              "prefix_caching": replicas[0].allocator.prefix_caching,  # as it ran (not beside a state)
              "replicas": len(replicas),
              "tensor_parallel": getattr(cfg.runner, "tensor_parallel", 1),
              "num_gpus": len(replicas) * getattr(cfg.runner, "tensor_parallel", 1),
              "cost_model": type(replicas[0].runner.cost_model).__name__ if cfg.runner.name == "sim" else None,
              # The serving engine a roofline modelled (its profile's name, or a file's, or `inline`).
              "engine_profile": _engine_name(cfg.runner) if getattr(cfg.runner, "hardware", None) else None,
              "weights": _weights(cfg),
              "layout_warning": replicas[0].layout_warning}
    tables = [_tables(engine) for engine in replicas]
    requests = pd.concat([t[0] for t in tables]).sort_values("request_id").reset_index(drop=True)
    steps = pd.concat([t[1].assign(replica=i) for i, t in enumerate(tables)], ignore_index=True)
    records = [r for e in replicas for r in e.records.requests]
    itl = metrics.inter_token_latencies([e.records for e in replicas])
    summary = metrics.summarize(requests, steps, itl, labels, cfg.slo.ttft_s, cfg.slo.tpot_s, len(replicas))
    summary |= {"partial": interrupted is not None, "num_prefix_evictions": sum(e.allocator.num_evictions
                                                                               for e in replicas)}
    summary |= environment(device, dtype) | measurement(load, steps)
    if len(replicas) > 1:
        write_csv(run_dir / "replicas.csv", pd.DataFrame([
            {"replica": i} | metrics.summarize(t[0], t[1], metrics.inter_token_latencies([e.records]), {},
                                                cfg.slo.ttft_s, cfg.slo.tpot_s)
            for i, (t, e) in enumerate(zip(tables, replicas))]))
    return finish_run(run_dir, raw, cfg, records, requests, steps, summary, workload.info, interrupted)


def _front_end(cfg: RunConfig) -> dict:
    """A simulated engine's front end, which its requests pass first. A real run's requests are the engine's at once,
    and so are those of a simulation from steps measured here (`runner.profile`: this harness's own engine, in
    process, whose real runs it predicts); an engine profile's front end is a serving engine's API server."""
    if cfg.runner.name != "sim" or cfg.runner.profile:
        return {}
    engine = configured_engine(cfg.runner)
    model_type = config_value(read_model_config(cfg.model), "model_type", "")
    return front_end(engine, cfg.runner.endpoint, model_type, engine.frontend_batches)


def _machine_load(cfg: RunConfig) -> MachineLoad | None:
    """What watches the machine while a real run measures wall time (its torch threads are its cores); None for a
    simulation, whose clock no other process can slow."""
    if cfg.runner.name != "real":
        return None
    import torch

    return MachineLoad(torch.get_num_threads())


def _real_replicas(cfg: RunConfig):
    """One replica on the model itself (a real run drives one model: no router)."""
    from harness.real.model import eos_token_ids, load_model, resolve_device, resolve_dtype
    from harness.real.runner import RealRunner

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device.type)
    log.info("loading model %s on %s", cfg.model.name, device)
    try:
        model, tokenizer = load_model(cfg.model, device, dtype)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name={cfg.model.name!r}: {e}") from None
    context = model.config.max_position_embeddings
    workload = load_workload(cfg, model.config.vocab_size, tokenizer, context)
    caps = device_caps(device)
    blocks = device_num_blocks(cfg, model, device, largest_step(cfg, workload, caps[0], context))

    def make_runner(allocator):
        runner = RealRunner(model, allocator, kernel_backend=cfg.kernel_backend)
        runner.warm_up()
        return runner

    eos = eos_token_ids(model) if cfg.stop_at_eos else ()
    engine = configured_replica(cfg, make_runner, blocks, model.config.max_position_embeddings, eos, Engine, caps)
    return [engine], None, workload, str(device), str(dtype)


def _weights(cfg: RunConfig) -> str | None:
    """What the run's outputs mean: a real run on random weights has real timings and meaningless tokens."""
    if cfg.runner.name == "sim":
        return None
    from harness.real.model import has_random_weights

    return "random (outputs meaningless, timings real)" if has_random_weights(cfg.model) else "pretrained"


def _tables(engine: Engine) -> tuple[pd.DataFrame, pd.DataFrame]:
    return metrics.requests_table(engine.records), metrics.steps_table(engine.records, engine.allocator.num_blocks)


def _engine_name(runner) -> str:
    return runner.engine if isinstance(runner.engine, str) else "inline"
