"""A run on a peer: the same workload, client, metrics and files as a run of ours, on another system.

`runner=hf_generate` and `runner=hf_continuous` run transformers' own batching on the run's model in this
process; `runner=openai` sends the workload to a server (started here if `runner.launch` says how). A peer
reports no steps, so its summary leaves padding, KV use and busy time empty (see `metrics.summarize`).
"""

import asyncio
import logging
import math
from pathlib import Path

import psutil
from omegaconf import DictConfig

from harness.analysis import metrics
from harness.analysis.results import RunInterrupted
from harness.analysis.run_files import finish_run
from harness.architecture import Architecture
from harness.config import ConfigError, RunConfig, server_python
from harness.core.records import RunRecords
from harness.core.replay import replay
from harness.environment import environment
from harness.machine_load import MachineLoad, measurement
from harness.model_spec import DTYPE_BYTES, dtype_name, load_tokenizer, read_model_config
from harness.peers.live import live_replay
from harness.peers.server_metrics import SERVER_KEYS
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
    # A launched server's command and version, and what a server reports about its own engine, said in the summary.
    server = {"server_command": None, "server_version": None, "stream_tokens_per_chunk": None} | dict.fromkeys(
        SERVER_KEYS)
    workload, (caps, concurrency), go = prepare(cfg, device, records, num_seqs, num_tokens, run_dir, server)
    load = _machine_load(cfg)
    try:
        go(load)
    except RunInterrupted as stop:
        interrupted = stop  # write what was measured, marked partial
    else:
        interrupted = None
    labels = {"strategy": system_label(cfg.runner), "workload": cfg.workload.name, "runner": cfg.runner.name,
              "model": cfg.model.name, "workload_source": workload.info.get("source", ""),
              "arrival": cfg.workload.arrival, "rate": cfg.workload.rate,
              "concurrency": concurrency, "max_concurrency": cfg.workload.max_concurrency,
              "engine_caps": f"{caps} ({whose})" if concurrency else caps,
              "block_size": cfg.kv_cache.block_size, "prefix_caching": _prefix_caching(cfg)}
    requests = metrics.requests_table(records).sort_values("request_id").reset_index(drop=True)
    summary = metrics.summarize(requests, None, metrics.inter_token_latencies([records]), labels, cfg.slo.ttft_s,
                                cfg.slo.tpot_s)
    summary |= ({"partial": interrupted is not None} | server | environment(str(device), dtype)
                | measurement(load, None))
    summary["measurement_warning"] = merged_stream_warning(summary["measurement_warning"],
                                                           server["stream_tokens_per_chunk"])
    return finish_run(run_dir, raw, cfg, records.requests, requests, None, summary, workload.info, interrupted)


def _prefix_caching(cfg: RunConfig) -> bool | None:
    """Whether the peer reused cached prefixes: what a server this run launched was told; unknown otherwise."""
    launch = getattr(cfg.runner, "launch", None)
    return cfg.kv_cache.prefix_caching if launch and "{prefix_caching_flag}" in launch else None


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
    """The peer's name in tables: the runner, and for a server the run started, which server it was: the launch
    command's program (a module by its package) and its subcommand, past `env` settings and the interpreter
    (`openai (transformers serve)`, `openai (vllm)`)."""
    if runner.name != "openai" or not runner.launch:
        return runner.name
    words = [w for w in runner.launch.split() if w not in ("env", "{python}", "-m") and "=" not in w]
    program = words[0].split(".")[0]
    subcommand = words[1] if len(words) > 1 and not words[1].startswith(("-", "{")) else ""
    return f"openai ({' '.join(filter(None, [program, subcommand]))})"


def _in_process(cfg: RunConfig, device, records: RunRecords, num_seqs: int, num_tokens: int, run_dir: Path,
                server: dict):
    """(workload, the caps used, `go(load)`, which runs it with `load` watching the machine) for transformers'
    batching in this process."""
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

        def go(load: MachineLoad) -> None:
            with load:
                replay([peer], workload.requests, progress=cfg.progress, desc=runner.name,
                       max_concurrency=cfg.workload.max_concurrency)

        return workload, (f"batch_size {batch_size}", batch_size), go
    from harness.peers.hf_continuous import TransformersContinuous

    max_seqs = num_seqs if runner.max_num_seqs == "auto" else runner.max_num_seqs
    max_tokens = num_tokens if runner.max_batch_tokens == "auto" else runner.max_batch_tokens
    blocks = device_num_blocks(cfg, model, device, (1, min(max_tokens, context), False))  # its token budget

    def go(load: MachineLoad) -> None:
        with TransformersContinuous(model, max_tokens, max_seqs, cfg.kv_cache.block_size, blocks) as peer, load:
            asyncio.run(live_replay(workload.requests, peer.submit, records, cfg.workload.max_concurrency,
                                    cfg.progress, runner.name))

    return workload, (f"max_batch_tokens {max_tokens}, max_num_seqs {max_seqs}, {blocks} blocks", max_seqs), go


def _over_http(cfg: RunConfig, device, records: RunRecords, num_seqs: int, num_tokens: int, run_dir: Path,
               server: dict):
    """(workload, caps, `go(load)`) for a server: the one at `runner.url`, or one started here, whose
    command and reported version go into `server`."""
    import aiohttp

    from harness.peers.openai_server import OpenAIClient, ServerError
    from harness.peers.server import launched_server, server_version, word_tokenizer
    from harness.peers.server_metrics import ServerMetrics

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
            except (ServerError, aiohttp.ClientError, TimeoutError) as e:
                reason = " ".join(str(e).split())  # aiohttp's connection errors span lines
                raise ConfigError(f"runner=openai: the server at {url} refused a first request: "
                                  f"{type(e).__name__}: {reason}") from None
            async with ServerMetrics(url) as own_figures:
                await live_replay(workload.requests, client.submit, records, cfg.workload.max_concurrency,
                                  cfg.progress, runner.name)
            server.update(own_figures.figures(), stream_tokens_per_chunk=_tokens_per_chunk(records))
        finally:
            await client.close()

    if runner.launch is None:

        def go_remote(load: MachineLoad) -> None:
            with load:
                asyncio.run(send(runner.url, runner.model))

        return workload, ("the server's own", None), go_remote
    model_path = served_model_path(cfg, tokenizer, run_dir)
    fields = launch_fields(cfg, device, config, num_seqs, num_tokens)
    given = [key for key in ("max_num_seqs", "max_batch_tokens", "num_blocks") if f"{{{key}}}" in runner.launch]
    caps = ", ".join(f"{key} {fields[key]}" for key in given) + " (given to the server)" if given else \
        "the server's own"

    def go(load: MachineLoad) -> None:
        command = runner.launch.format(port="<port>", model_path=model_path, **({"python": "<python>"} | fields))
        log.info("starting the server: %s", command)
        server.update(server_command=" ".join(command.split()))
        try:
            with launched_server(runner.launch, model_path, runner.ready_timeout_s, run_dir / "server.log",
                                 **fields) as url:
                server.update(server_version=server_version(url))
                with load:  # the workload alone, while the server's processes are alive to count as the run's
                    asyncio.run(send(url, model_path))
        except RuntimeError as e:
            raise ConfigError(str(e)) from None

    return workload, (caps, fields["max_num_seqs"] if given else None), go


def merged_stream_warning(warning: str | None, tokens_per_chunk: float | None) -> str | None:
    """The run's measurement warning, with a stream whose tokens came merged (see `_tokens_per_chunk`) said too."""
    if tokens_per_chunk is None or tokens_per_chunk <= MERGED_STREAM:
        return warning
    merged = (f"the server streamed {tokens_per_chunk:.1f} tokens a chunk: its front end fell behind its engine "
              "and merged tokens, so TTFT, TPOT and ITL read from the stream are not the engine's")
    return f"{warning}; {merged}" if warning else merged


# Tokens a chunk beyond which a stream was merged: a server streaming every token sends about 1 (the first chunk of
# some servers carries two).
MERGED_STREAM = 1.5


def _tokens_per_chunk(records: RunRecords) -> float | None:
    """Output tokens over the stream chunks that carried them: 1 when the server streams every token as it is made;
    more when its front end fell behind its engine and merged tokens into one chunk (vLLM does), so that TPOT and
    ITL read from the stream are no longer the engine's."""
    finished = [r for r in records.requests if r.token_times_s]
    chunks = sum(len(r.token_times_s) for r in finished)
    return sum(r.num_output_tokens for r in finished) / chunks if chunks else None


def launch_fields(cfg: RunConfig, device, config: dict, num_seqs: int, num_tokens: int) -> dict:
    """The run's settings a launch command may name, so a server runs as our engines do: `{num_blocks}` and
    `{block_size}` (the cache: `auto` is the CPU's fixed pool; on a GPU give kv_cache.num_blocks), `{kv_cache_gib}`
    (what those blocks take, whole GiB), `{max_num_seqs}` and `{max_batch_tokens}` (our continuous strategy's caps,
    `auto` resolved as for our runs), `{dtype}`, `{seed}`, `{cpu_list}` (the cores of torch's threads, `0-1`),
    `{prefix_caching_flag}` (vLLM's flag for `kv_cache.prefix_caching`) and, with `runner.server_env`, `{python}`
    (its interpreter)."""
    import torch

    runner, strategy = cfg.runner, cfg.strategy
    blocks = cfg.kv_cache.num_blocks
    if blocks == "auto":
        blocks = CPU_NUM_BLOCKS if device.type != "cuda" else None
    if blocks is None and ("{num_blocks}" in runner.launch or "{kv_cache_gib}" in runner.launch):
        raise ConfigError("runner.launch names {num_blocks}: on a GPU say kv_cache.num_blocks=<blocks> for the server")
    dtype = dtype_name(cfg.dtype, device.type)
    seqs = getattr(strategy, "max_num_seqs", "auto")
    tokens = getattr(strategy, "max_batch_tokens", "auto")
    concurrency = num_seqs if cfg.concurrency == "auto" else cfg.concurrency
    per_token = Architecture.from_config(config, DTYPE_BYTES[dtype]).kv_bytes_per_token
    kv_gib = math.ceil((blocks or 0) * cfg.kv_cache.block_size * per_token / 2**30)
    fields = {"num_blocks": blocks, "block_size": cfg.kv_cache.block_size, "kv_cache_gib": max(1, kv_gib),
              "max_num_seqs": concurrency if seqs == "auto" else seqs,
              "max_batch_tokens": num_tokens if tokens == "auto" else tokens, "dtype": dtype, "seed": cfg.seed,
              "cpu_list": f"0-{torch.get_num_threads() - 1}",
              "prefix_caching_flag": "--enable-prefix-caching" if cfg.kv_cache.prefix_caching
              else "--no-enable-prefix-caching"}
    if runner.server_env:
        fields["python"] = str(server_python(runner.server_env))
    return fields


def served_model_path(cfg: RunConfig, tokenizer, run_dir: Path) -> str:
    """What a launched server loads: a hub id or folder as given, or the default model saved into the run."""
    if cfg.model.source == "hf":
        return cfg.model.name
    import torch

    from harness.peers.server import save_served_model
    from harness.real.model import load_model

    model, _ = load_model(cfg.model, torch.device("cpu"), torch.float32)
    return str(save_served_model(model, tokenizer, run_dir / "served_model"))
