"""A run on a peer: the same workload, client, metrics and files as a run of ours, on another system.

`runner=hf_generate` and `runner=hf_continuous` run transformers' own batching on the run's model in this
process; `runner=openai` sends the workload to a server (started here if `runner.launch` says how). A peer
reports no steps, so its summary leaves padding, KV use and busy time empty (see `metrics.summarize`).
"""

import asyncio
import logging
from pathlib import Path

import psutil
from omegaconf import DictConfig

from harness.analysis import metrics
from harness.analysis.results import RunInterrupted
from harness.analysis.run_files import finish_run
from harness.config import ConfigError, RunConfig
from harness.core.records import RunRecords
from harness.core.replay import replay
from harness.environment import environment
from harness.machine_load import MachineLoad, measurement
from harness.model_spec import dtype_name, load_tokenizer, read_model_config
from harness.peers.live import live_replay
from harness.run_parts import CPU_NUM_BLOCKS, device_caps, device_num_blocks, load_workload

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
logging.getLogger("httpx2").setLevel(logging.WARNING)


def run_peer(cfg: RunConfig, raw: DictConfig, run_dir: Path) -> dict:
    from harness.real.model import resolve_device

    device = resolve_device(cfg.device)
    dtype = dtype_name(cfg.dtype, device.type)
    (num_seqs, num_tokens), whose = device_caps(device)
    records = RunRecords()
    prepare = _in_process if cfg.runner.name in ("hf_generate", "hf_continuous") else _over_http
    workload, (caps, concurrency), go = prepare(cfg, device, records, num_seqs, num_tokens, run_dir)
    load = _machine_load(cfg)
    try:
        with load:
            go()
    except RunInterrupted as stop:
        interrupted = stop  # write what was measured, marked partial
    else:
        interrupted = None
    labels = {"strategy": system_label(cfg.runner), "workload": cfg.workload.name, "runner": cfg.runner.name,
              "model": cfg.model.name, "workload_source": workload.info.get("source", ""),
              "arrival": cfg.workload.arrival, "rate": cfg.workload.rate,
              "concurrency": concurrency, "max_concurrency": cfg.workload.max_concurrency,
              "engine_caps": f"{caps} ({whose})" if concurrency else caps,
              "block_size": cfg.kv_cache.block_size}
    requests = metrics.requests_table(records).sort_values("request_id").reset_index(drop=True)
    summary = metrics.summarize(requests, None, metrics.inter_token_latencies([records]), labels, cfg.slo.ttft_s,
                                cfg.slo.tpot_s)
    summary |= {"partial": interrupted is not None} | environment(str(device), dtype) | measurement(load, None)
    return finish_run(run_dir, raw, cfg, records.requests, requests, None, summary, workload.info, interrupted)


def _machine_load(cfg: RunConfig) -> MachineLoad:
    """What watches the machine while a peer runs: transformers' batching keeps torch's threads busy; a server
    (ours to start, or one on this machine at `runner.url`, whose processes then count as the run's) may use
    every core beside the client."""
    import torch

    if cfg.runner.name != "openai":
        return MachineLoad(torch.get_num_threads())
    from harness.peers.server import local_server_pids

    return MachineLoad(psutil.cpu_count() or 1, local_server_pids(cfg.runner.url) if cfg.runner.url else ())


def system_label(runner) -> str:
    """The peer's name in tables: the runner, and for a server the run started, which server it was."""
    if runner.name == "openai" and runner.launch:
        words = [w for w in runner.launch.split() if w not in ("{python}", "-m")]
        return f"openai ({' '.join(words[:2]).replace('transformers.cli.transformers', 'transformers')})"
    return runner.name


def _in_process(cfg: RunConfig, device, records: RunRecords, num_seqs: int, num_tokens: int, run_dir: Path):
    """(workload, the caps used, a callable that runs it) for transformers' batching in this process."""
    from harness.real.model import load_model, resolve_dtype

    try:
        model, tokenizer = load_model(cfg.model, device, resolve_dtype(cfg.dtype, device.type))
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name={cfg.model.name!r}: {e}") from None
    context = model.config.max_position_embeddings
    workload = load_workload(cfg, model.config.vocab_size, tokenizer, context)
    runner = cfg.runner
    if runner.name == "hf_generate":
        from harness.peers.hf_generate import GenerateBatches

        batch_size = num_seqs if runner.batch_size == "auto" else runner.batch_size
        peer = GenerateBatches(model, batch_size, context)
        peer.records = records
        peer.warm_up()
        return workload, (f"batch_size {batch_size}", batch_size), lambda: replay(
            [peer], workload.requests, progress=cfg.progress, desc=runner.name,
            max_concurrency=cfg.workload.max_concurrency)
    from harness.peers.hf_continuous import TransformersContinuous

    max_seqs = num_seqs if runner.max_num_seqs == "auto" else runner.max_num_seqs
    max_tokens = num_tokens if runner.max_batch_tokens == "auto" else runner.max_batch_tokens
    blocks = device_num_blocks(cfg, model, device, model.dtype)

    def go() -> None:
        with TransformersContinuous(model, max_tokens, max_seqs, cfg.kv_cache.block_size, blocks) as peer:
            asyncio.run(live_replay(workload.requests, peer.submit, records, cfg.workload.max_concurrency,
                                    cfg.progress, runner.name))

    return workload, (f"max_batch_tokens {max_tokens}, max_num_seqs {max_seqs}, {blocks} blocks", max_seqs), go


def _over_http(cfg: RunConfig, device, records: RunRecords, num_seqs: int, num_tokens: int, run_dir: Path):
    """(workload, caps, a callable that runs it) for a server: the one at `runner.url`, or one started here."""
    import openai

    from harness.peers.openai_server import OpenAIClient
    from harness.peers.server import launched_server, word_tokenizer

    runner = cfg.runner
    config = read_model_config(cfg.model)
    own_tokenizer = load_tokenizer(cfg.model)
    workload = load_workload(cfg, config["vocab_size"], own_tokenizer, config["max_position_embeddings"])
    # Prompts go as text through the model's tokenizer; the default model has none, so it gets the word-level one
    # the server it is served by loads too.
    tokenizer = own_tokenizer or word_tokenizer(config["vocab_size"])

    async def send(url: str, model: str) -> None:
        client = OpenAIClient(url, model, runner.endpoint, runner.prompt, runner.lengths, runner.api_key_env,
                              runner.timeout_s, tokenizer)
        try:
            try:
                await client.warm_up()
            except openai.APIError as e:
                raise ConfigError(f"runner=openai: the server at {url} refused a first request: "
                                  f"{type(e).__name__}: {e}") from None
            await live_replay(workload.requests, client.submit, records, cfg.workload.max_concurrency, cfg.progress,
                              runner.name)
        finally:
            await client.close()

    if runner.launch is None:
        return workload, ("the server's own", None), lambda: asyncio.run(send(runner.url, runner.model))
    model_path = _served_model_path(cfg, tokenizer, run_dir)
    fields = _launch_fields(cfg, device)

    def go() -> None:
        log.info("starting the server: %s", runner.launch.format(port="<port>", model_path=model_path,
                                                                 python="<python>", **fields))
        try:
            with launched_server(runner.launch, model_path, runner.ready_timeout_s, run_dir / "server.log",
                                 **fields) as url:
                asyncio.run(send(url, model_path))
        except RuntimeError as e:
            raise ConfigError(str(e)) from None

    return workload, ("the server's own", None), go


def _launch_fields(cfg: RunConfig, device) -> dict:
    """The run's engine settings a launch command may name, so a server gets the cache our engines get:
    `{num_blocks}` (`auto` is the CPU's fixed pool; on a GPU give kv_cache.num_blocks) and `{block_size}`."""
    blocks = cfg.kv_cache.num_blocks
    if blocks == "auto":
        blocks = CPU_NUM_BLOCKS if device.type != "cuda" else None
    if blocks is None and "{num_blocks}" in cfg.runner.launch:
        raise ConfigError("runner.launch names {num_blocks}: on a GPU say kv_cache.num_blocks=<blocks> for the server")
    return {"num_blocks": blocks, "block_size": cfg.kv_cache.block_size}


def _served_model_path(cfg: RunConfig, tokenizer, run_dir: Path) -> str:
    """What a launched server loads: a hub id or folder as given, or the default model saved into the run."""
    if cfg.model.source == "hf":
        return cfg.model.name
    import torch

    from harness.peers.server import save_served_model
    from harness.real.model import load_model

    model, _ = load_model(cfg.model, torch.device("cpu"), torch.float32)
    return str(save_served_model(model, tokenizer, run_dir / "served_model"))
