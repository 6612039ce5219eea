"""One job: config → model, workload, cache, strategy, runner → engine run → tables, summary, report on disk."""

import json
import logging
import platform
from pathlib import Path

import pandas as pd
import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from harness import metrics
from harness.config import ConfigError, validate
from harness.engine import Engine, RunRecords
from harness.kv_cache import BlockAllocator
from harness.model import load_model, resolve_device, resolve_dtype
from harness.report import run_report, terminal_table
from harness.results import write_csv, write_json, write_text
from harness.runners.real import RealRunner
from strategies import STRATEGIES, BatchPlan, Request, ScheduledChunk, Strategy
from workloads import build_workload

log = logging.getLogger(__name__)


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


def run_job(cfg: DictConfig, run_dir: Path) -> dict:
    validate(cfg)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model, tokenizer = load_model(cfg.model, device, dtype)
    workload = build_workload(cfg.workload, model.config.vocab_size, tokenizer)
    for key, value in workload.info.items():
        log.info("workload %s: %s", key, value)

    allocator = BlockAllocator(cfg.kv_cache.num_blocks, cfg.kv_cache.block_size)
    strategy = build_strategy(cfg.strategy, allocator)
    if allocator.num_blocks < strategy.max_concurrency:
        raise ConfigError(f"kv_cache.num_blocks={allocator.num_blocks} cannot hold one block for each of the "
                          f"{strategy.max_concurrency} requests {strategy.name} may run at once")
    runner = RealRunner(model, allocator, kernel_backend=cfg.kernel_backend)
    warm_up(runner, allocator)
    eos = model.config.eos_token_id if cfg.stop_at_eos else None
    engine = Engine(strategy, runner, allocator, max_model_len=model.config.max_position_embeddings,
                    eos_token_id=eos if isinstance(eos, int) else None, progress=bool(cfg.progress))
    records = engine.run(workload.requests)
    if allocator.num_used_blocks:
        raise RuntimeError(f"{allocator.num_used_blocks} KV blocks still held after the run: a block leak")

    labels = {"strategy": strategy.name, "workload": workload.name, "runner": cfg.runner.name,
              "model": cfg.model.name, "workload_source": workload.info.get("source", "")}
    requests = metrics.requests_table(records)
    steps = metrics.steps_table(records, allocator.num_blocks)
    summary = metrics.summarize(requests, steps, metrics.inter_token_latencies(records), labels)
    summary |= {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version()}
    _write(run_dir, cfg, records, requests, steps, summary, workload.info, bool(cfg.save_tokens))
    print(terminal_table(summary))
    print(f"results: {run_dir}")
    return summary


def _write(run_dir: Path, cfg: DictConfig, records: RunRecords, requests: pd.DataFrame, steps: pd.DataFrame,
           summary: dict, workload_info: dict, save_tokens: bool) -> None:
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    write_csv(run_dir / "requests.csv", requests)
    write_csv(run_dir / "steps.csv", steps)
    if save_tokens:
        lines = [json.dumps({"request_id": r.request_id, "status": r.status.name.lower(),
                             "prompt_ids": r.token_ids[:r.num_prompt_tokens], "output_ids": r.output_ids})
                 for r in records.requests]
        write_text(run_dir / "tokens.jsonl", "\n".join(lines) + "\n")
    write_text(run_dir / "report.md", run_report(summary, requests, steps, workload_info))
    write_json(run_dir / "summary.json", summary)  # last: its presence means the run is complete
