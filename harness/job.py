"""One job: config → workload, replicas (cache, strategy, runner) → replay → tables, summary, report on disk.

The composition root: it imports the real runner (torch, transformers) only for `runner=real`.
"""

import json
import logging
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from harness.analysis import metrics
from harness.analysis.plots import plot_run
from harness.analysis.report import run_report, terminal_table
from harness.analysis.results import RunInterrupted, write_csv, write_json, write_table, write_text
from harness.config import CPU_ENGINE_CAPS, PEERS, ConfigError, RunConfig, validate
from harness.core.engine import Engine
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.environment import environment
from harness.model_spec import DTYPE_BYTES, Architecture, dtype_name, load_tokenizer, read_model_config
from strategies import Request
from workloads import build_workload

log = logging.getLogger(__name__)
CPU_NUM_BLOCKS = 2048  # `kv_cache.num_blocks=auto` on a CPU, real or simulated: 32k slots at block size 16


def run_job(raw: DictConfig, run_dir: Path) -> dict:
    """Run the job `raw` (a composed Hydra config) describes, writing its results into `run_dir`."""
    cfg = validate(raw)
    if cfg.runner.name in PEERS:
        from harness.peers.job import run_peer  # transformers' engines or a server: their own clock

        return run_peer(cfg, raw, run_dir)
    build = _real_replicas if cfg.runner.name == "real" else simulated_replicas
    replicas, route, workload, device, dtype = build(cfg)
    try:
        replay(replicas, workload.requests, route, progress=cfg.progress, desc=cfg.strategy.name,
               max_concurrency=cfg.workload.max_concurrency,
               frontend_latency_s=getattr(cfg.runner, "frontend_latency_s", 0.0),
               frontend_service_s=getattr(cfg.runner, "frontend_service_s", 0.0))
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
              "block_size": cfg.kv_cache.block_size, "replicas": len(replicas),
              "tensor_parallel": getattr(cfg.runner, "tensor_parallel", 1),
              "num_gpus": len(replicas) * getattr(cfg.runner, "tensor_parallel", 1),
              "cost_model": type(replicas[0].runner.cost_model).__name__ if cfg.runner.name == "sim" else None,
              "weights": _weights(cfg)}
    tables = [_tables(engine) for engine in replicas]
    requests = pd.concat([t[0] for t in tables]).sort_values("request_id").reset_index(drop=True)
    steps = pd.concat([t[1].assign(replica=i) for i, t in enumerate(tables)], ignore_index=True)
    records = [r for e in replicas for r in e.records.requests]
    itl = metrics.inter_token_latencies([e.records for e in replicas])
    summary = metrics.summarize(requests, steps, itl, labels, cfg.slo.ttft_s, cfg.slo.tpot_s)
    summary |= {"partial": interrupted is not None} | environment(device, dtype)
    if len(replicas) > 1:
        write_csv(run_dir / "replicas.csv", pd.DataFrame([
            {"replica": i} | metrics.summarize(t[0], t[1], metrics.inter_token_latencies([e.records]), {},
                                                cfg.slo.ttft_s, cfg.slo.tpot_s)
            for i, (t, e) in enumerate(zip(tables, replicas))]))
    return finish_run(run_dir, raw, cfg, records, requests, steps, summary, workload.info, interrupted)


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
    workload = load_workload(cfg, model.config.vocab_size, tokenizer, model.config.max_position_embeddings)
    blocks, caps = device_num_blocks(cfg, model, device, dtype), device_caps(device)

    def make_runner(allocator):
        runner = RealRunner(model, allocator, kernel_backend=cfg.kernel_backend)
        runner.warm_up()
        return runner

    eos = eos_token_ids(model) if cfg.stop_at_eos else ()
    engine = _replica(cfg, make_runner, blocks, model.config.max_position_embeddings, eos, Engine, caps)
    return [engine], None, workload, str(device), str(dtype)


def device_num_blocks(cfg: RunConfig, model, device, dtype) -> int:
    """`kv_cache.num_blocks`, `auto` resolved: what the GPU's free memory holds once the weights are loaded, or
    the CPU's fixed pool."""
    if cfg.kv_cache.num_blocks != "auto":
        return cfg.kv_cache.num_blocks
    if device.type != "cuda":
        return CPU_NUM_BLOCKS
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    arch = Architecture.from_config(model.config, dtype.itemsize)
    return int(free * cfg.kv_cache.memory_fraction // (cfg.kv_cache.block_size * arch.kv_bytes_per_token))


def device_caps(device) -> tuple[tuple[int, int], str]:
    """The engine caps `auto` means on this device ((max_num_seqs, max_batch_tokens), whose they are)."""
    if device.type != "cuda":
        return CPU_ENGINE_CAPS, "the CPU defaults"
    import torch

    from harness.sim.costmodel.hardware import serving_defaults

    name = torch.cuda.get_device_name(device)
    return serving_defaults(name, torch.cuda.get_device_properties(device).total_memory), f"vLLM's on {name}"


def simulated_replicas(cfg: RunConfig):
    """`runner.replicas` simulated replicas behind `runner.router`; the model is only described, never loaded."""
    from harness.sim.costmodel import build_cost_model
    from harness.sim.replica import simulated_engine
    from harness.sim.router import ROUTERS
    from harness.sim.runner import SimRunner

    config = read_model_config(cfg.model)
    accelerated = cfg.runner.hardware not in (None, "cpu")
    dtype = dtype_name(cfg.dtype, "cuda" if accelerated else "cpu")
    try:
        costs = build_cost_model(cfg.runner, Architecture.from_config(config, DTYPE_BYTES[dtype]))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tokenizer = load_tokenizer(cfg.model)
    workload = load_workload(cfg, config["vocab_size"], tokenizer, config["max_position_embeddings"],
                             with_ids=False)  # a simulation needs lengths only
    if cfg.kv_cache.num_blocks != "auto":
        blocks = cfg.kv_cache.num_blocks
    else:
        blocks = auto_num_blocks(costs, cfg.kv_cache.block_size, cfg.kv_cache.memory_fraction)
    hardware = getattr(costs, "hardware", None)
    if hardware is not None and hardware.kind == "gpu":
        caps = hardware.serving_defaults, f"vLLM's on {hardware.name}"
    else:
        caps = CPU_ENGINE_CAPS, "the CPU defaults"
    replicas = [_replica(cfg, lambda allocator: SimRunner(costs), blocks, config["max_position_embeddings"], (),
                         simulated_engine, caps) for _ in range(cfg.runner.replicas)]
    route = ROUTERS[cfg.runner.router]() if len(replicas) > 1 else None
    return replicas, route, workload, "cpu", dtype


def auto_num_blocks(costs, block_size: int, memory_fraction: float) -> int:
    """`kv_cache.num_blocks=auto` in a simulation: what the accelerator's memory holds beside the weights; for a
    CPU (calibrated here, or the roofline of this CPU), the real CPU runner's fixed cache, so both compare."""
    hardware = getattr(costs, "hardware", None)
    if hardware is None or hardware.kind == "cpu":
        return CPU_NUM_BLOCKS
    try:
        return costs.num_kv_blocks(block_size, memory_fraction)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _replica(cfg: RunConfig, make_runner, num_blocks: int, max_model_len: int, eos, engine_class,
             caps: tuple[tuple[int, int], str]) -> Engine:
    """A replica with the strategy's options, `auto` caps replaced by `caps` ((sequences, tokens), whose)."""
    (num_seqs, num_tokens), whose = caps
    if num_seqs > num_blocks:  # `auto` fits the hardware: no more running requests than the cache has blocks
        num_seqs, whose = num_blocks, f"{whose}, capped at the KV cache's {num_blocks} blocks"
    options = cfg.strategy.model_dump(exclude={"name"})
    auto = sorted(key for key, value in options.items() if value == "auto")
    options |= {key: num_tokens if key == "max_batch_tokens" else num_seqs for key in auto}
    try:
        engine = build_replica(cfg.strategy.name, options, make_runner, num_blocks=num_blocks,
                               block_size=cfg.kv_cache.block_size, max_model_len=max_model_len, eos_token_ids=eos,
                               engine_class=engine_class)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    engine.caps_source = f"{', '.join(auto)} from {whose}" if auto else "as configured"
    if auto:
        log.info("engine caps: %s = %s (%s)", ", ".join(auto), ", ".join(str(options[k]) for k in auto), whose)
    return engine


def _weights(cfg: RunConfig) -> str | None:
    """What the run's outputs mean: a real run on random weights has real timings and meaningless tokens."""
    if cfg.runner.name == "sim":
        return None
    from harness.real.model import has_random_weights

    return "random (outputs meaningless, timings real)" if has_random_weights(cfg.model) else "pretrained"


def load_workload(cfg: RunConfig, vocab_size: int, tokenizer, max_model_len: int, with_ids: bool = True):
    workload = build_workload(cfg.workload, vocab_size, tokenizer, max_model_len, with_ids)
    for key, value in workload.info.items():
        if key != "provenance":  # long; the report carries it
            log.info("workload %s: %s", key, value)
    return workload


def _tables(engine: Engine) -> tuple[pd.DataFrame, pd.DataFrame]:
    return metrics.requests_table(engine.records), metrics.steps_table(engine.records, engine.allocator.num_blocks)


def write_results(run_dir: Path, raw: DictConfig, cfg: RunConfig, records: list[Request], requests: pd.DataFrame,
                  steps: pd.DataFrame | None, summary: dict, workload_info: dict) -> None:
    """Every file of a finished run. `steps` None: a peer, which reports no steps (no step table)."""
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(raw, resolve=True))
    tables = [write_table(run_dir, "requests", requests, cfg.results.tables)]
    if steps is not None and cfg.results.steps == "full":
        tables.append(write_table(run_dir, "steps", steps, cfg.results.tables))
    if cfg.save_tokens:
        lines = [json.dumps({"request_id": r.request_id, "status": r.status.label,
                             "prompt_ids": r.token_ids[:r.num_prompt_tokens], "output_ids": r.output_ids})
                 for r in sorted(records, key=lambda r: r.request_id)]
        write_text(run_dir / "tokens.jsonl", "\n".join(lines) + "\n")
    title = f"{summary['strategy']} on {summary['workload']}"
    plots = plot_run(requests, steps if steps is not None else pd.DataFrame(), title, run_dir / "plots")
    write_text(run_dir / "report.md", run_report(summary, requests, steps, workload_info,
                                                 [p.relative_to(run_dir) for p in plots], tables))
    write_json(run_dir / "summary.json", summary)  # last: its presence means the run is complete


def finish_run(run_dir: Path, raw: DictConfig, cfg: RunConfig, records: list[Request], requests: pd.DataFrame,
               steps: pd.DataFrame | None, summary: dict, workload_info: dict,
               interrupted: RunInterrupted | None) -> dict:
    """Write the run's files and print its table; then stop as interrupted if it was, else return the summary."""
    write_results(run_dir, raw, cfg, records, requests, steps, summary, workload_info)
    print(terminal_table(summary))
    print(f"results: {run_dir}")
    if interrupted is not None:
        raise interrupted
    return summary
