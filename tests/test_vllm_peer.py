"""vLLM's V1 engine as a peer (`system=vllm`): started by the run on a loopback port from its own environment
(`bash scripts/install-vllm.sh`), with our engine caps, cache, dtype and threads, and stopped after. Each start
compiles the model for over a minute, so these are slow tests, and they skip where vLLM is not installed."""

import json

import pandas as pd
import pytest

from harness.config import ConfigError, compose_config, server_python
from harness.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not server_python(".venv-vllm").is_file(),
                                                     reason="vLLM is not installed (bash scripts/install-vllm.sh)")]


def test_vllm_serves_the_workload_with_our_caps_and_says_its_version(tmp_path):
    summary = run_job(compose_config(["system=vllm", "workload=random", "workload.num_requests=8",
                                      "workload.input_len=64", "workload.output_len=16",
                                      "workload.max_concurrency=4", "progress=false"]), tmp_path)
    assert summary["num_finished"] == 8 and summary["num_failed"] == 0
    assert (pd.read_csv(tmp_path / "requests.csv").num_output_tokens == 16).all()  # ignore_eos: the lengths asked
    assert summary["server_version"] and "vllm.entrypoints.openai.api_server" in summary["server_command"]
    for flag in ("--max-num-seqs 16", "--max-num-batched-tokens 512", "--block-size 32",
                 "--num-gpu-blocks-override 2048", "--dtype float32"):
        assert flag in summary["server_command"], flag
    assert json.loads((tmp_path / "summary.json").read_text())["other_cpu_cores"] is not None


def test_a_server_that_cannot_start_is_one_error_naming_its_cause(tmp_path):
    # vLLM's CPU attention takes blocks of a multiple of 32 tokens: 16 is refused as the engine starts.
    with pytest.raises(ConfigError, match="exited with code .* No common block size for 16"):
        run_job(compose_config(["system=vllm", "kv_cache.block_size=16", "workload=random",
                                "workload.num_requests=2", "progress=false"]), tmp_path)
    assert (tmp_path / "server.log").is_file()
