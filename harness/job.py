"""One job: config → workload, replicas (cache, strategy, runner) → replay → tables, summary, report on disk."""

import importlib.metadata
import json
import logging
import platform
import subprocess
from pathlib import Path

import pandas as pd
import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from harness import metrics
from harness.config import ConfigError, validate
from harness.costmodel import CalibratedCostModel, RooflineCostModel
from harness.costmodel.hardware import get_hardware
from harness.costmodel.roofline import Architecture
from harness.engine import Engine, RunRecords, replay
from harness.kv_cache import BlockAllocator
from harness.model import load_model, load_tokenizer, model_config, resolve_device, resolve_dtype
from harness.plots import plot_run
from harness.report import run_report, terminal_table
from harness.results import write_csv, write_json, write_text
from harness.router import ROUTERS
from harness.runners.real import RealRunner
from harness.runners.sim import SimRunner
from strategies import STRATEGIES, BatchPlan, Request, ScheduledChunk, Strategy
from workloads import build_workload

log = logging.getLogger(__name__)
CPU_NUM_BLOCKS = 2048  # `kv_cache.num_blocks=auto` on a CPU, real or calibrated: 32k slots at block size 16


def build_strategy(strategy_cfg: DictConfig, allocator: BlockAllocator) -> Strategy:
    options = {k: v for k, v in OmegaConf.to_container(strategy_cfg, resolve=True).items() if k != "name"}
    try:
        return STRATEGIES[strategy_cfg.name](allocator, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"strategy={strategy_cfg.name}: {e}") from None


def warm_up(runner: RealRunner, allocator: BlockAllocator) -> None:
    """One ragged and one padded step on a throwaway request, so one-time set-up costs stay out of the timings."""
    request = Request(request_id=-1, arrival_s=0.0, token_ids=list(range(8)), num_prompt_tokens=8, max_new_tokens=1)
    allocator.allocate(request.request_id, request.num_tokens)
    for padded in (False, True):
        runner.execute(BatchPlan(chunks=[ScheduledChunk(request, 0, request.num_tokens)], padded=padded))
    allocator.free(request.request_id)


def cost_model(cfg: DictConfig, config, dtype: torch.dtype):
    """runner=sim: a roofline when `runner.hardware` is named, else the calibrated profile `runner.profile`."""
    if cfg.runner.hardware and cfg.runner.profile:
        raise ConfigError("runner=sim takes runner.hardware (roofline) or runner.profile (calibrated), not both")
    if cfg.runner.hardware:
        try:
            hardware = get_hardware(cfg.runner.hardware)
        except KeyError as e:
            raise ConfigError(f"runner.hardware: {e.args[0]}") from None
        arch = Architecture.from_config(config, dtype.itemsize)
        return RooflineCostModel(arch, hardware, cfg.runner.compute_efficiency, cfg.runner.memory_efficiency,
                                 cfg.runner.step_overhead_s)
    if not cfg.runner.profile:
        raise ConfigError("runner=sim needs runner.hardware=<a100-80gb|h100|h200|l4|cpu> or runner.profile=<csv "
                          "from python -m harness.profile>")
    try:
        return CalibratedCostModel.load(cfg.runner.profile)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"runner.profile: {e}") from None


def num_blocks(cfg: DictConfig, device: torch.device, costs, config, dtype: torch.dtype) -> int:
    """`kv_cache.num_blocks`, or with `auto` what the device holds beside the weights."""
    if cfg.kv_cache.num_blocks != "auto":
        return cfg.kv_cache.num_blocks
    fraction, block_size = cfg.kv_cache.memory_fraction, cfg.kv_cache.block_size
    if isinstance(costs, RooflineCostModel) and costs.hardware.name != "cpu (measured)":
        try:
            return costs.num_kv_blocks(block_size, fraction)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if device.type == "cuda" and cfg.runner.name == "real":
        free, _ = torch.cuda.mem_get_info(device)  # the weights are already loaded
        arch = Architecture.from_config(config, dtype.itemsize)
        return int(free * fraction // (block_size * arch.kv_bytes_per_token))
    return CPU_NUM_BLOCKS


def run_job(cfg: DictConfig, run_dir: Path) -> dict:
    validate(cfg)
    device = resolve_device(cfg.device) if cfg.runner.name == "real" else torch.device("cpu")
    hardware_type = "cuda" if cfg.runner.name == "sim" and cfg.runner.hardware not in (None, "cpu") else device.type
    dtype = resolve_dtype(cfg.dtype, hardware_type)
    if cfg.runner.name == "real":
        try:
            model, tokenizer = load_model(cfg.model, device, dtype)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        config, costs = model.config, None
    else:
        model, config, tokenizer = None, model_config(cfg.model), load_tokenizer(cfg.model)
        costs = cost_model(cfg, config, dtype)
    workload = build_workload(cfg.workload, config.vocab_size, tokenizer)
    for key, value in workload.info.items():
        if key != "provenance":  # long; the report carries it
            log.info("workload %s: %s", key, value)

    blocks = num_blocks(cfg, device, costs, config, dtype)
    engines = []
    for _ in range(cfg.runner.replicas):
        allocator = BlockAllocator(blocks, cfg.kv_cache.block_size)
        strategy = build_strategy(cfg.strategy, allocator)
        if allocator.num_blocks < strategy.max_concurrency:
            raise ConfigError(f"kv_cache.num_blocks={allocator.num_blocks} cannot hold one block for each of the "
                              f"{strategy.max_concurrency} requests {strategy.name} may run at once")
        if model is not None:
            runner = RealRunner(model, allocator, kernel_backend=cfg.kernel_backend)
            warm_up(runner, allocator)
        else:
            runner = SimRunner(costs)
        eos = config.eos_token_id if cfg.stop_at_eos else None
        engines.append(Engine(strategy, runner, allocator, max_model_len=config.max_position_embeddings,
                              eos_token_id=eos if isinstance(eos, int) else None))
    replay(engines, ROUTERS[cfg.runner.router](), workload.requests, progress=bool(cfg.progress),
           desc=engines[0].strategy.name)
    for engine in engines:
        if engine.allocator.num_used_blocks:
            raise RuntimeError(f"{engine.allocator.num_used_blocks} KV blocks still held after the run: a leak")

    labels = {"strategy": cfg.strategy.name, "workload": workload.name, "runner": cfg.runner.name,
              "model": cfg.model.name, "workload_source": workload.info.get("source", ""),
              "arrival": cfg.workload.get("arrival"), "rate": cfg.workload.get("rate"),
              "concurrency": engines[0].strategy.max_concurrency, "num_blocks": blocks,
              "block_size": cfg.kv_cache.block_size, "replicas": len(engines),
              "cost_model": type(costs).__name__ if costs else None}
    tables = [_tables(engine, blocks) for engine in engines]
    requests = pd.concat([t[0] for t in tables]).sort_values("request_id").reset_index(drop=True)
    steps = pd.concat([t[1].assign(replica=i) for i, t in enumerate(tables)], ignore_index=True)
    records = [r for e in engines for r in e.records.requests]
    itl = metrics.inter_token_latencies(RunRecords(records))
    summary = metrics.summarize(requests, steps, itl, labels, cfg.slo.ttft_s, cfg.slo.tpot_s)
    summary |= environment(device, dtype)
    if len(engines) > 1:
        write_csv(run_dir / "replicas.csv", pd.DataFrame([
            {"replica": i} | metrics.summarize(t[0], t[1], metrics.inter_token_latencies(e.records), {},
                                                cfg.slo.ttft_s, cfg.slo.tpot_s)
            for i, (t, e) in enumerate(zip(tables, engines))]))
    _write(run_dir, cfg, records, requests, steps, summary, workload.info, bool(cfg.save_tokens))
    print(terminal_table(summary))
    print(f"results: {run_dir}")
    return summary


def _tables(engine: Engine, blocks: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    return metrics.requests_table(engine.records), metrics.steps_table(engine.records, blocks)


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What a reader needs to reproduce or distrust a timing."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        commit = ""
    return {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else platform.processor() or platform.machine(), "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "triton": _version("triton"), "python": platform.python_version(), "git_commit": commit or None,
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _write(run_dir: Path, cfg: DictConfig, records: list[Request], requests: pd.DataFrame, steps: pd.DataFrame,
           summary: dict, workload_info: dict, save_tokens: bool) -> None:
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    write_csv(run_dir / "requests.csv", requests)
    write_csv(run_dir / "steps.csv", steps)
    if save_tokens:
        lines = [json.dumps({"request_id": r.request_id, "status": r.status.name.lower(),
                             "prompt_ids": r.token_ids[:r.num_prompt_tokens], "output_ids": r.output_ids})
                 for r in sorted(records, key=lambda r: r.request_id)]
        write_text(run_dir / "tokens.jsonl", "\n".join(lines) + "\n")
    title = f"{summary['strategy']} on {summary['workload']}"
    plots = plot_run(requests, steps, title, run_dir / "plots")
    write_text(run_dir / "report.md", run_report(summary, requests, steps, workload_info,
                                                 [p.relative_to(run_dir) for p in plots]))
    write_json(run_dir / "summary.json", summary)  # last: its presence means the run is complete
