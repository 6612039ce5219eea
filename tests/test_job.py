"""Whole runs through the Hydra config: files on disk, the summary contract, clear errors on bad config."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.config import ConfigError, compose_config
from harness.job import run_job
from tests.conftest import ROOT

SUMMARY_KEYS = (
    "strategy workload runner model num_requests num_finished num_rejected num_preemptions makespan_s "
    "request_throughput_rps output_throughput_tps total_throughput_tps num_computed_tokens num_padding_tokens "
    "padding_waste kv_peak_utilization kv_mean_utilization busy_s"
).split() + [f"{m}_{s}" for m in ("ttft_s", "tpot_s", "itl_s", "e2e_s") for s in ("mean", "p50", "p90", "p99")]

SMALL = ["workload=synthetic", "workload.num_requests=6", "workload.prompt.low=4", "workload.prompt.high=40",
         "workload.output.low=2", "workload.output.high=12", "progress=false", "concurrency=4"]


def config(*overrides: str):
    return compose_config([*SMALL, *overrides])


@pytest.mark.parametrize("strategy", ["static", "dynamic", "continuous"])
def test_a_run_writes_its_tables_summary_and_report(strategy, tmp_path):
    summary = run_job(config(f"strategy={strategy}", "save_tokens=true"), tmp_path)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["num_finished"] == 6 and summary["num_rejected"] == 0
    assert (summary["padding_waste"] == 0) == (strategy == "continuous")
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert sorted(requests.request_id) == list(range(6))
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert steps.num_padding_tokens.sum() == summary["num_padding_tokens"]
    assert (steps.num_prefill_tokens + steps.num_decode_tokens).sum() == (
        requests.prompt_len + requests.num_output_tokens - 1).sum()
    tokens = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert [len(t["output_ids"]) for t in sorted(tokens, key=lambda t: t["request_id"])] == list(
        requests.sort_values("request_id").max_new_tokens)
    assert "padding" in (tmp_path / "report.md").read_text()
    cfg = config(f"strategy={strategy}", "save_tokens=true")
    assert OmegaConf.load(tmp_path / "config.yaml") == OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def test_a_request_longer_than_the_context_is_rejected_and_the_rest_run(tmp_path):
    summary = run_job(config("workload.prompt.low=900", "workload.prompt.high=3000", "workload.prompt.max=3000"),
                      tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    rejected = requests[requests.status == "rejected"]
    assert len(rejected) >= 1 and rejected.reject_reason.str.contains("context of 2048").all()
    assert summary["num_finished"] + summary["num_rejected"] == 6


@pytest.mark.parametrize("override,message", [
    ("device=tpu", "device should be 'auto', 'cpu' or 'cuda', got 'tpu'"),
    ("dtype=float8", "dtype should be 'auto', 'float32', 'float16' or 'bfloat16', got 'float8'"),
    ("kv_cache.block_size=0", "kv_cache.block_size should be greater than or equal to 1, got 0"),
    ("kv_cache.num_blocks=3", "cannot hold one block for each of the 4 requests"),
    ("strategy.order=random", "strategy.order should be 'decode_first' or 'prefill_first', got 'random'"),
    ("kv_cache.eviction=lru", "kv_cache.eviction should be 'auto', 'release_order' or 'empty_first', got 'lru'"),
    ("strategy.max_batch_tokens=-5", "strategy.max_batch_tokens should be 'auto' or a whole number >= 1, got -5"),
    # A rate whose arrivals a float clock cannot tell apart from the run's steps (already at 1e-12 TTFTs round).
    ("workload.rate=1e-12", "workload: rate=1e-12 spreads 6 requests over 5e\\+12 s, more than ten years"),
])
def test_bad_config_values_fail_before_any_work_naming_the_value(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        run_job(config(override), tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_the_command_line_runs_and_reports_errors_in_one_line(tmp_path):
    run = [sys.executable, "-m", "harness", *SMALL, "workload.num_requests=3"]
    ok = subprocess.run([*run, "strategy=dynamic", f"hydra.run.dir={tmp_path / 'ok'}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "output throughput" in ok.stdout
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["num_finished"] == 3
    bad = subprocess.run([*run, "kv_cache.num_blocks=2", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert "error: kv_cache.num_blocks=2 cannot hold" in bad.stderr
    assert json.loads((tmp_path / "bad" / "status.json").read_text())["status"] == "failed"


def test_our_kernels_never_shadow_the_hub_package_transformers_imports():
    # transformers 5.25 depends on the Hub's `kernels` package and imports it while its models load; a top-level
    # package of ours named `kernels` shadowed it from the repository root, and no model could be built.
    import importlib.util

    import ragged_kernels  # noqa: F401  (ours, importable)

    found = importlib.util.find_spec("kernels")  # the Hub's, where transformers installed it
    assert not (ROOT / "kernels").exists() and (found is None or Path(found.origin).parent != ROOT / "kernels")
    from transformers import PreTrainedModel  # noqa: F401  (loads the hub-kernels integration where it is installed)


@pytest.mark.parametrize("source,path", [
    ("sharegpt", "sharegpt_small.json"), ("azure", "azure_small.csv"), ("burstgpt", "burstgpt_small.csv"),
    ("mooncake", "mooncake_small.jsonl"),
])
def test_every_source_runs_end_to_end(source, path, tmp_path):
    cfg = compose_config([
        "strategy=continuous", f"workload={source}", f"workload.path={ROOT / 'tests' / 'fixtures' / path}",
        "workload.num_requests=5", "workload.max_prompt_len=48", "workload.max_output_len=6", "progress=false",
    ])
    summary = run_job(cfg, tmp_path)
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] >= 3
    assert summary["workload"] == source


def test_a_local_hf_model_with_its_own_tokenizer_runs(tmp_path, tiny_model_cfg):
    """`model=hf model.name=<path>`: weights and tokenizer from a folder, ShareGPT text through that tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from harness.real.model import build_random_model, model_config

    folder = tmp_path / "model"
    words = (ROOT / "tests" / "fixtures" / "sharegpt_small.json").read_text().split()
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(words, trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
    build_random_model(model_config(tiny_model_cfg), 0).save_pretrained(folder)
    summary = run_job(compose_config([
        "model=hf", f"model.name={folder}", "workload=sharegpt", "workload.max_output_len=4", "progress=false",
        f"workload.path={ROOT / 'tests' / 'fixtures' / 'sharegpt_small.json'}", "strategy=dynamic"]), tmp_path / "run")
    assert summary["num_finished"] == 3
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"tokenizer: the model's tokenizer ({folder})" in report  # not the cl100k fallback


def test_stop_at_eos_honours_a_list_of_eos_ids(tmp_path):
    """A config whose eos_token_id is a list (Llama-3's are) still stops generation at any of them."""
    free = run_job(config("strategy=continuous", "save_tokens=true", "workload.num_requests=2"), tmp_path / "free")
    assert free["num_finished"] == 2
    outputs = [json.loads(line)["output_ids"] for line in (tmp_path / "free" / "tokens.jsonl").read_text().splitlines()]
    stop = outputs[0][0]  # request 0's first token: with it as an EOS id, request 0 ends at once
    assert len(outputs[0]) > 1
    run_job(config("strategy=continuous", "save_tokens=true", "workload.num_requests=2", "stop_at_eos=true",
                   f"+model.config.eos_token_id=[8191,{stop}]"), tmp_path / "eos")
    stopped = [json.loads(line)["output_ids"] for line in (tmp_path / "eos" / "tokens.jsonl").read_text().splitlines()]
    assert stopped[0] == [stop]
