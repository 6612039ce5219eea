"""Peers: transformers' `generate()` batches and continuous batching in process, and the live (wall-clock) replay
every peer shares. The server runner has its own tests (test_openai_runner.py)."""

import asyncio

import pytest
import torch

from harness.analysis import metrics
from harness.config import compose_config
from harness.core.records import RunRecords
from harness.core.replay import replay
from harness.job import run_job
from harness.peers.hf_continuous import TransformersContinuous
from harness.peers.hf_generate import GenerateBatches
from harness.peers.live import live_replay
from strategies import RequestStatus
from tests.conftest import make_specs
from tests.test_oracle import LENGTHS, generate


def outstanding_at(requests, t):
    return sum(r.sent_s <= t < r.finish_s for r in requests)


def test_generate_batches_keep_each_requests_own_tokens_and_times(reference_model):
    """Left-padded batches of 3 give each request the tokens `generate()` gives it alone, one time per token,
    and the batch's requests wait for the batch: static batching, as users run it."""
    specs = make_specs(LENGTHS)
    peer = GenerateBatches(reference_model, batch_size=3, max_model_len=2048)
    replay([peer], specs)
    requests = sorted(peer.records.requests, key=lambda r: r.request_id)
    for request, spec in zip(requests, specs):
        assert request.status == RequestStatus.FINISHED
        assert request.output_ids == generate(reference_model, spec)[0], f"request {spec.request_id}"
        assert len(request.token_times_s) == spec.max_new_tokens
        assert request.token_times_s == sorted(request.token_times_s)
    first_batch_end = max(r.finish_s for r in requests[:3])
    assert all(r.first_scheduled_s >= first_batch_end for r in requests[3:])  # nothing joins mid-batch


def test_generate_batches_reject_what_the_context_cannot_hold(reference_model):
    specs = make_specs([(10, 5), (30, 5)])
    peer = GenerateBatches(reference_model, batch_size=2, max_model_len=32)
    replay([peer], specs)
    statuses = [r.status for r in sorted(peer.records.requests, key=lambda r: r.request_id)]
    assert statuses == [RequestStatus.FINISHED, RequestStatus.REJECTED]
    assert "exceeds the model's context of 32" in peer.records.requests[1].reject_reason


def test_transformers_continuous_batching_gives_every_request_its_length(reference_model):
    specs = make_specs(LENGTHS)
    records = RunRecords()
    with TransformersContinuous(reference_model, max_batch_tokens=32, max_num_seqs=4, block_size=16,
                                num_blocks=64) as peer:
        asyncio.run(live_replay(specs, peer.submit, records, max_concurrency=4))
    requests = sorted(records.requests, key=lambda r: r.request_id)
    assert [r.status for r in requests] == [RequestStatus.FINISHED] * len(specs)
    for request, spec in zip(requests, specs):
        assert request.num_output_tokens == spec.max_new_tokens == len(request.token_times_s)
        assert request.sent_s <= request.token_times_s[0] <= request.finish_s
        assert request.output_ids == generate(reference_model, spec)[0], f"request {spec.request_id}"
    events = sorted({r.sent_s for r in requests})
    assert max(outstanding_at(requests, t) for t in events) <= 4


def test_the_live_replay_keeps_the_client_and_turns_errors_into_failed_requests():
    """A closed loop of 2 over wall time; one request's error fails it alone, with its reason."""

    async def submit(request, clock):
        await asyncio.sleep(0.02)
        if request.request_id == 2:
            raise ConnectionError("the server went away")
        request.token_ids.append(7)
        request.token_times_s.append(clock())
        request.finish_s = clock()
        request.status = RequestStatus.FINISHED

    records = RunRecords()
    asyncio.run(live_replay(make_specs([(4, 1)] * 6), submit, records, max_concurrency=2))
    requests = sorted(records.requests, key=lambda r: r.request_id)
    assert [r.status for r in requests].count(RequestStatus.FAILED) == 1
    assert requests[2].reject_reason == "ConnectionError: the server went away"
    assert max(outstanding_at(requests, r.sent_s) for r in requests) <= 2
    assert requests[-1].sent_s >= 0.04  # two rounds of 20 ms went before it


def test_a_peer_summary_leaves_what_it_cannot_know_empty(tmp_path):
    summary = run_job(compose_config(["runner=hf_generate", "workload=random", "workload.num_requests=4",
                                      "workload.input_len=8", "workload.output_len=3", "progress=false"]), tmp_path)
    assert summary["num_finished"] == 4 and summary["strategy"] == "hf_generate"
    for key in metrics.ENGINE_SIDE:
        assert summary[key] is None, key
    assert summary["output_throughput_tps"] > 0 and summary["ttft_s_p50"] > 0
    assert not (tmp_path / "steps.csv").exists()
    assert "reports no steps" in (tmp_path / "report.md").read_text()
    # It measured wall time, so the machine's load over it is known; its steps' spread is not.
    assert summary["machine_cores"] >= 1 and summary["other_cpu_cores"] >= 0 and summary["step_time_spread"] is None
    assert "## Measurement" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("system", ["static", "hf_generate", "transformers_serve"])
def test_a_system_sets_the_runner_and_strategy_together(system):
    cfg = compose_config([f"system={system}"])
    expected = {"static": ("real", "static"), "hf_generate": ("hf_generate", None),
                "transformers_serve": ("openai", None)}[system]
    assert cfg.runner.name == expected[0]
    if expected[1]:
        assert cfg.strategy.name == expected[1]


@pytest.mark.parametrize("system,label", [("vllm", "openai (vllm)"),
                                          ("transformers_serve", "openai (transformers serve)"),
                                          ("hf_continuous", "hf_continuous")])
def test_a_launched_server_is_named_by_its_program(system, label):
    from harness.peers.job import system_label

    assert system_label(compose_config([f"system={system}"]).runner) == label


def test_the_client_benchmark_runs_the_server_and_both_clients_on_the_overrides_given():
    from harness.peers.client_bench import parse_args, run_overrides

    overrides = run_overrides(parse_args(["--concurrency", "2", "model.config.num_hidden_layers=8"]))
    server = compose_config(["system=vllm", "kv_cache.prefix_caching=false", *overrides])
    ours = compose_config(["runner=openai", "runner.url=http://127.0.0.1:1/v1", *overrides])
    for cfg in (server, ours):
        assert cfg.model.config.num_hidden_layers == 8 and cfg.workload.max_concurrency == 2
        assert cfg.workload.num_requests == 64 and cfg.workload.input_len == 128


def test_side_by_side_the_two_clients_split_the_loop_and_ours_starts_with_vllm_benchs_main_run(tmp_path):
    import sys

    from harness.peers.client_bench import parse_args, run_overrides, side_by_side

    ours = compose_config(["runner=openai", "runner.url=http://127.0.0.1:1/v1",
                           *run_overrides(parse_args(["--side-by-side", "--concurrency", "8"]))])
    assert ours.workload.max_concurrency == 4  # each client half of the loop
    assert ours.workload.range_ratio == 0.5  # lengths that vary: two loops of alike requests lock their phases
    with pytest.raises(SystemExit, match="must be even, not 3"):
        run_overrides(parse_args(["--side-by-side", "--concurrency", "3"]))

    # A stand-in for vllm bench: its readiness test, the line, then its run (ours must overlap it), then its result.
    out = tmp_path / "bench.json"
    result = {"output_throughput": 100.0, "median_ttft_ms": 20.0, "median_tpot_ms": 5.0, "itls": [[0.005] * 3],
              "output_lens": [4]}
    script = (f"import json, time; print('Initial test run completed.'); print('Starting main benchmark run...'); "
              f"time.sleep(0.5); open({str(out)!r}, 'w').write(json.dumps({result!r}))")
    seen = []
    clients = side_by_side([sys.executable, "-c", script], out, lambda: seen.append(out.exists()) or {"mine": 1})
    assert seen == [False]  # ours ran while vllm bench's main run did
    assert clients["batchlab"] == {"mine": 1}
    assert clients["vllm bench"] == {"output_throughput_tps": 100.0, "ttft_s_p50": 0.02, "tpot_s_p50": 0.005,
                                     "tokens_per_chunk": 1.0}

    failing = "import sys; sys.exit('error: the server at that URL did not answer')"
    seen.clear()
    with pytest.raises(SystemExit, match="did not answer"):
        side_by_side([sys.executable, "-c", failing], tmp_path / "none.json", lambda: seen.append(1))
    assert not seen  # vllm bench never started its run: ours did not either


def test_the_vllm_sweep_measures_every_load_each_round_from_a_new_start_on_an_uncached_server():
    from harness.peers.job import launch_fields
    from harness.peers.vllm import replay_setup
    from harness.peers.vllm_sweep import loads, parse_args, round_order, server_config

    todo = loads(parse_args(["--out", "x", "--concurrency", "1", "4", "--rates", "2.5"]))
    assert [name for name, _ in todo] == ["concurrency-1", "concurrency-4", "rate-2.5"]
    assert todo[2][1] == ["workload.arrival=poisson", "workload.rate=2.5"]
    assert [[name for name, _ in round_order(todo, k)] for k in (1, 2, 4)] == [
        ["concurrency-1", "concurrency-4", "rate-2.5"], ["concurrency-4", "rate-2.5", "concurrency-1"],
        ["concurrency-1", "concurrency-4", "rate-2.5"]]
    cfg = server_config(["workload=random"])
    command = cfg.runner.launch.format(**launch_fields(cfg, torch.device("cpu"), {"num_hidden_layers": 1,
                                       "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
                                       "vocab_size": 128, "intermediate_size": 128}, 16, 512) | {
                                       "model_path": "m", "port": 1})
    assert "--no-enable-prefix-caching" in command  # rounds resend the same prompts
    # What its setup.yaml tells a replay: the caps vLLM got, no overlap of host and model (vLLM on a CPU), no cache.
    assert replay_setup(server_config(["workload=random", "strategy.max_num_seqs=12"])) == {
        "max_num_seqs": 12, "max_num_batched_tokens": 512, "async_scheduling": False, "prefix_caching": False,
        "eviction": "empty_first"}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in command  # vLLM keeps a core for its front end
