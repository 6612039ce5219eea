"""`runner=openai` against a real OpenAI-compatible server: `transformers serve --continuous-batching` on a free
loopback port, over the default model saved with its word-level tokenizer. Nothing leaves the machine."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.config import ConfigError, compose_config
from harness.job import run_job
from harness.peers.server import launched_server, save_served_model, word_tokenizer
from harness.real.model import load_model
from harness.sim.measured import load_measured_runs
from tests.conftest import ROOT

# The KV cache of our CPU runs: left to itself a server takes 13 GB, and two at once do not fit the machine.
SERVE = ("{python} -m transformers.cli.transformers serve {model_path} --continuous-batching --cb-num-blocks "
         "{num_blocks} --cb-block-size {block_size} --host 127.0.0.1 --port {port}")
CACHE = {"num_blocks": 2048, "block_size": 16}


@pytest.fixture(scope="module")
def served_model(tmp_path_factory) -> Path:
    cfg = compose_config([])
    model, _ = load_model(cfg.model, torch.device("cpu"), torch.float32)
    return save_served_model(model, word_tokenizer(model.config.vocab_size), tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def server(served_model, tmp_path_factory):
    with launched_server(SERVE, str(served_model), 180, tmp_path_factory.mktemp("log") / "server.log", **CACHE) as url:
        yield url


def openai_run(url: str, model, tmp_path: Path, *extra: str) -> dict:
    cfg = compose_config(["runner=openai", f"runner.url={url}", f"runner.model={model}",
                          "runner.lengths=generation_config", "runner.timeout_s=60", "workload=random",
                          "workload.num_requests=6", "workload.input_len=16", "workload.output_len=8",
                          "workload.max_concurrency=3", "progress=false", *extra])
    return run_job(cfg, tmp_path)


def test_a_workload_streams_through_the_server_with_vllms_metrics(server, served_model, tmp_path):
    summary = openai_run(server, served_model, tmp_path)
    assert summary["num_finished"] == 6 and summary["num_failed"] == 0 and summary["runner"] == "openai"
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert (requests.num_output_tokens == 8).all()  # the server's usage count: the lengths asked for
    assert (requests.ttft_s > 0).all() and (requests.e2e_s >= requests.ttft_s).all()
    # vLLM's TPOT: (E2E - TTFT) / (output tokens - 1)
    expected = (requests.e2e_s - requests.ttft_s) / (requests.num_output_tokens - 1)
    assert requests.tpot_s.to_numpy() == pytest.approx(expected.to_numpy())
    assert summary["padding_waste"] is None and summary["busy_s"] is None  # a server reports neither


def test_the_readmes_sweep_of_a_server_keeps_every_job_and_compares_them(server, served_model, tmp_path):
    # The README's example: a URL and a model path in the overrides, both holding `/`.
    done = subprocess.run([sys.executable, "-m", "harness", "-m", "runner=openai", f"runner.url={server}",
                           f"runner.model={served_model}", "model=hf", f"model.name={served_model}",
                           "runner.lengths=generation_config", "workload=random", "workload.num_requests=4",
                           "workload.input_len=16", "workload.output_len=4", "workload.max_concurrency=1,4",
                           "progress=false", f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    comparison = pd.read_csv(tmp_path / "comparison.csv")
    assert len(comparison) == 2 and (comparison.status == "finished").all()
    assert all((tmp_path / run / "summary.json").is_file() and "/" not in run for run in comparison.run)
    (measured,) = {len(run.requests) for run in load_measured_runs([str(tmp_path)], {"hardware": "h100"})}
    assert measured == 4


def test_a_wrong_model_name_is_one_clear_error(server, tmp_path):
    with pytest.raises(ConfigError, match="refused a first request"):
        openai_run(server, "no-such-model", tmp_path)


def test_a_wrong_port_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="refused a first request: ClientConnectorError"):
        openai_run("http://127.0.0.1:9/v1", "m", tmp_path)


def test_the_run_can_start_and_stop_the_server_itself(served_model, tmp_path):
    cfg = compose_config(["runner=openai", f"runner.launch='{SERVE}'", "runner.lengths=generation_config",
                          "model=tiny-llama", "workload=random", "workload.num_requests=3", "workload.input_len=8",
                          "workload.output_len=4", "progress=false"])
    summary = run_job(cfg, tmp_path)
    assert summary["num_finished"] == 3
    assert (tmp_path / "served_model" / "tokenizer.json").is_file() and (tmp_path / "server.log").is_file()


@pytest.mark.slow  # the default set kills a vLLM server mid-run (tests/test_vllm_server.py)
def test_a_server_killed_mid_run_fails_its_requests_and_the_run_ends(served_model, tmp_path):
    with launched_server(SERVE, str(served_model), 180, tmp_path / "server.log", **CACHE) as url:
        port = int(url.split(":")[-1].split("/")[0])
        process = next(p for p in _children() if p[1][-2:] == ["--port", str(port)])
        stop = threading.Event()
        # Killed once it has taken the warm-up and the first four requests (uvicorn logs each completion request as it
        # starts to answer it: transformers 5.25 logs no line of its own unless --enable-log-requests), which then have
        # some 2000 tokens each to go.
        killer = threading.Thread(target=_kill_after, args=(process[0], tmp_path / "server.log", 5, stop))
        killer.start()
        try:
            summary = openai_run(url, served_model, tmp_path / "run", "workload.output_len=2000",
                                 "workload.num_requests=8", "workload.max_concurrency=4")
        finally:
            stop.set()
            killer.join()
    assert summary["num_failed"] >= 1 and summary["num_finished"] + summary["num_failed"] == 8
    reasons = pd.read_csv(tmp_path / "run" / "requests.csv").query("status == 'failed'").reject_reason
    assert all(reason and isinstance(reason, str) for reason in reasons)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_unfinished"] == 0


def _children() -> list[tuple[int, str]]:
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            found.append((process.pid, process.cmdline()))
        except psutil.Error:  # gone, or a zombie of an earlier test
            pass
    return found


def _kill_after(pid: int, log: Path, num_requests: int, stop: threading.Event) -> None:
    import os
    import signal

    while not stop.wait(0.1):
        if log.read_text(errors="replace").count('"POST /v1/completions') >= num_requests:
            os.kill(pid, signal.SIGKILL)
            return
