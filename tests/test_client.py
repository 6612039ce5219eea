"""The benchmark client (open and closed loop, as vllm bench), vLLM's random dataset, and engine caps that fit the
hardware."""

import dataclasses
import math

import numpy as np
import pytest

from harness.config import compose_config
from harness.core.replay import Client
from harness.core.replica import build_replica
from harness.job import run_job
from strategies import RequestStatus
from tests.conftest import ScriptedRunner, StepCost, make_specs
from workloads import build_workload


def run_client(specs, max_concurrency, step_s=0.01, max_num_seqs=16, latency_s=0.0, service_s=0.0, batches=False):
    engine = build_replica(
        "continuous",
        dict(max_batch_tokens=64, max_num_seqs=max_num_seqs),
        lambda a: ScriptedRunner(cost=StepCost(step_s)),
        num_blocks=256,
        block_size=4,
        max_model_len=2048,
    )
    from harness.core.replay import replay

    replay([engine], specs, max_concurrency=max_concurrency, frontend_latency_s=latency_s, frontend_service_s=service_s,
           frontend_batches=batches)
    return sorted(engine.records.requests, key=lambda r: r.request_id)


def outstanding_at(requests, t):
    return sum(r.sent_s <= t < r.finish_s for r in requests)


def test_a_closed_loop_client_keeps_at_most_c_requests_outstanding():
    specs = make_specs([(6, 3 + i % 4) for i in range(10)])  # all wanted at t=0
    requests = run_client(specs, max_concurrency=3)
    assert all(r.status == RequestStatus.FINISHED for r in requests)
    events = sorted({r.sent_s for r in requests} | {r.finish_s for r in requests})
    assert max(outstanding_at(requests, t) for t in events) == 3
    finishes = sorted(r.finish_s for r in requests)
    # The first 3 go at once; each later one goes out the moment an earlier one finishes, in arrival order.
    assert [r.sent_s for r in requests] == [0.0, 0.0, 0.0, *finishes[:7]]


def test_a_clients_cost_follows_its_requests_not_its_cap():
    import tracemalloc

    specs = make_specs([(6, 3)] * 16)
    tracemalloc.start()
    Client(specs, max_concurrency=10**9)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # a slot per allowed request would be 8 GB
    capped, uncapped = run_client(specs, max_concurrency=10**9), run_client(specs, max_concurrency=None)
    assert [(r.sent_s, r.finish_s) for r in capped] == [(r.sent_s, r.finish_s) for r in uncapped]


def test_latencies_count_from_the_send_not_from_the_arrival():
    from harness.analysis.metrics import requests_table
    from harness.core.records import RunRecords

    requests = run_client(make_specs([(6, 5)] * 6), max_concurrency=2)
    table = requests_table(RunRecords(requests))
    assert table.ttft_s.tolist() == pytest.approx([r.token_times_s[0] - r.sent_s for r in requests])
    assert table.client_wait_s.max() > 0.09  # the last ones waited for slots...
    assert table.ttft_s.max() < 0.03  # ...but their TTFT starts when they were sent, as vllm bench counts it


def test_a_closed_loop_client_combines_with_a_rate():
    arrivals = [0.0, 0.001, 0.002, 1.0, 1.001]
    requests = run_client(make_specs([(6, 4)] * 5, arrivals=arrivals), max_concurrency=1)
    assert requests[1].sent_s == requests[0].finish_s and requests[2].sent_s == requests[1].finish_s
    assert requests[3].sent_s == 1.0  # the slot was free long before: sent when the workload wants it


def test_an_open_loop_client_sends_at_the_arrival_times():
    arrivals = [0.0, 0.005, 0.5]
    requests = run_client(make_specs([(6, 4)] * 3, arrivals=arrivals), max_concurrency=None)
    assert [r.sent_s for r in requests] == arrivals


def test_the_front_end_latency_delays_the_engine_not_the_send():
    requests = run_client(make_specs([(6, 4)]), max_concurrency=None, latency_s=0.03)
    assert requests[0].sent_s == 0.0 and requests[0].first_scheduled_s == pytest.approx(0.03)


def test_the_front_end_hands_requests_on_one_at_a_time():
    """Sent together, requests reach the engine `service_s` apart, so the first starts a step alone and the rest
    follow: sent together, they do not stay in lockstep as they would with no front end at all."""
    requests = run_client(make_specs([(6, 4)] * 4), max_concurrency=None, latency_s=0.03, service_s=0.002, step_s=0.01)
    assert [r.sent_s for r in requests] == [0.0] * 4
    assert requests[0].first_scheduled_s == pytest.approx(0.03)
    assert [r.first_scheduled_s for r in requests[1:]] == pytest.approx([0.04] * 3)  # after the first's step
    together = run_client(make_specs([(6, 4)] * 4), max_concurrency=None, latency_s=0.03, step_s=0.01)
    assert [r.first_scheduled_s for r in together] == pytest.approx([0.03] * 4)


def test_a_front_end_that_batches_hands_a_burst_over_as_one_once_it_has_parsed_it():
    """vLLM 0.11's API server: every request of a burst is parsed before any reaches the engine, and then all do;
    a request sent while the front end is busy waits for the next batch; one sent to an idle front end goes alone."""
    specs = make_specs([(6, 4)] * 4 + [(6, 4)])
    specs[-1] = dataclasses.replace(specs[-1], arrival_s=0.005)  # arrives while the burst is being parsed
    requests = run_client(specs, max_concurrency=None, latency_s=0.003, service_s=0.002, step_s=0.01, batches=True)
    assert [r.sent_s for r in requests] == [0.0] * 4 + [0.005]
    assert [r.first_scheduled_s for r in requests[:4]] == pytest.approx([0.008] * 4)  # 4 x 2 ms, then together
    assert requests[4].first_scheduled_s == pytest.approx(0.018)  # its batch: parsed 8-10 ms, in at the next step
    sparse = make_specs([(6, 4)] * 3)
    sparse = [dataclasses.replace(s, arrival_s=i * 1.0) for i, s in enumerate(sparse)]
    one_by_one = run_client(sparse, max_concurrency=None, latency_s=0.003, service_s=0.002)
    batched = run_client(sparse, max_concurrency=None, latency_s=0.003, service_s=0.002, batches=True)
    assert [r.first_scheduled_s for r in batched] == pytest.approx([r.first_scheduled_s for r in one_by_one])
    assert [r.first_scheduled_s for r in batched] == pytest.approx([0.003, 1.003, 2.003])  # the latency, not 2 ms


def test_a_request_freed_to_go_before_the_next_batch_starts_is_not_held_back_by_it():
    """A conversation's next turn, released after the front end looked ahead at a later request, goes first."""
    first, later, turn = make_specs([(4, 2)] * 3, arrivals=[0.0, 10.0, 0.0])
    turn = dataclasses.replace(turn, follows=first.request_id, think_s=1.0)
    client = Client([first, later, turn], latency_s=0.0, service_s=0.001, batches=True)
    assert client.send() == (first, 0.0)
    assert client.next_delivery_s == pytest.approx(10.001)  # only the later request is known
    client.complete(first.request_id, 2.0)  # releases the turn, sent at 3 s
    assert client.next_delivery_s == pytest.approx(3.001)
    assert client.send()[0].request_id == turn.request_id and client.send()[0] == later
    assert not client.has_pending


def test_a_closed_loop_behind_a_batching_front_end_sends_and_finishes_every_request():
    specs = make_specs([(6, 3 + i % 4) for i in range(10)])
    requests = run_client(specs, max_concurrency=3, service_s=0.002, batches=True)
    assert all(r.status == RequestStatus.FINISHED for r in requests)
    assert [r.first_scheduled_s for r in requests[:3]] == pytest.approx([0.006] * 3)  # the first 3, parsed together
    events = sorted({r.sent_s for r in requests} | {r.finish_s for r in requests})
    assert max(outstanding_at(requests, t) for t in events) == 3


def test_a_rejected_request_frees_its_client_slot_at_once():
    specs = make_specs([(3000, 5), (6, 4), (6, 4)])  # the first is longer than the context
    requests = run_client(specs, max_concurrency=1)
    assert requests[0].status == RequestStatus.REJECTED and requests[1].sent_s == 0.0


def test_the_client_refuses_nothing_and_loses_nothing_when_slots_are_scarce():
    client = Client(make_specs([(4, 2)] * 3), max_concurrency=1)
    spec, sent = client.send()
    assert (spec.request_id, sent) == (0, 0.0) and math.isinf(client.next_send_s)
    client.complete(spec.request_id, 2.5)
    assert client.next_send_s == 2.5 and client.has_pending


def random_workload(**overrides):
    cfg = compose_config(["workload=random", *[f"workload.{k}={v}" for k, v in overrides.items()]]).workload
    return build_workload(cfg, vocab_size=1000)


def test_the_random_dataset_draws_as_vllms_does():
    """vLLM: input and output lengths uniform on the integers [floor(L(1-r)), ceil(L(1+r))], after a shared prefix."""
    workload = random_workload(num_requests=4000, input_len=100, output_len=40, range_ratio=0.25, prefix_len=7)
    inputs = np.array([r.prompt_len for r in workload.requests]) - 7
    outputs = np.array([r.max_new_tokens for r in workload.requests])
    assert (inputs.min(), inputs.max()) == (75, 125) and (outputs.min(), outputs.max()) == (30, 50)
    assert inputs.mean() == pytest.approx(100, rel=0.01) and outputs.mean() == pytest.approx(40, rel=0.01)
    prefixes = {r.prompt_ids[:7] for r in workload.requests}
    assert len(prefixes) == 1 and len({r.prompt_ids[7:10] for r in workload.requests}) > 3000


def test_the_random_dataset_with_no_range_is_fixed_lengths():
    workload = random_workload(num_requests=20, input_len=64, output_len=8)
    assert {(r.prompt_len, r.max_new_tokens) for r in workload.requests} == {(64, 8)}


@pytest.mark.parametrize(
    "hardware,caps",
    [
        ("h100", (1024, 8192)),
        ("h200", (1024, 8192)),
        ("a100-80gb", (256, 2048)),
        ("l40s", (256, 2048)),
        ("cpu", (16, 512)),
    ],
)
def test_auto_engine_caps_follow_the_hardware(hardware, caps, tmp_path):
    summary = run_job(
        compose_config(
            [
                "runner=sim",
                "model=llama-3.1-8b",
                f"runner.hardware={hardware}",
                "workload=random",
                "workload.num_requests=4",
                "workload.input_len=64",
                "workload.output_len=8",
                "progress=false",
            ]
        ),
        tmp_path,
    )
    steps_cap, tokens_cap = caps
    assert summary["concurrency"] == steps_cap
    assert "max_batch_tokens, max_num_seqs from" in summary["engine_caps"]


def vllm_bench_random(tmp_path, range_ratio: float) -> dict:
    """`vllm bench serve --dataset-name random --random-input-len 1024 --random-output-len 128 --max-concurrency 8`
    for Llama-3.1-8B on an H100, in one line."""
    return run_job(
        compose_config(
            [
                "runner=sim",
                "model=llama-3.1-8b",
                "runner.hardware=h100",
                "workload=random",
                "workload.input_len=1024",
                "workload.output_len=128",
                "workload.max_concurrency=8",
                f"workload.range_ratio={range_ratio}",
                "workload.num_requests=64",
                "progress=false",
            ]
        ),
        tmp_path,
    )


def test_ttft_counts_from_the_send_so_a_closed_loop_run_shows_no_queueing_seconds(tmp_path):
    spread = vllm_bench_random(tmp_path / "spread", 0.5)
    # Lengths that differ let requests finish (and the next be sent) one at a time: a TTFT is one 1024-token
    # prefill beside the others' decodes, tens of milliseconds.
    assert spread["num_finished"] == 64 and spread["max_concurrency"] == 8
    assert 0.01 < spread["ttft_s_p50"] < 0.1 and 0.004 < spread["tpot_s_p50"] < 0.02
    # Equal lengths (vLLM's default range ratio 0) keep the 8 in step: each wave's 8 prompts (8192 tokens, the
    # H100's batched-token default) prefill together, in one step of about 0.2 s, as they would on vLLM.
    waves = vllm_bench_random(tmp_path / "waves", 0.0)
    assert 0.15 < waves["ttft_s_p50"] < 0.4


def test_the_client_sends_in_arrival_order_whatever_the_workloads_order_with_released_turns_among_them():
    late, first, reply, middle = make_specs([(4, 2)] * 4, arrivals=[5.0, 0.0, 0.0, 3.0])
    reply = dataclasses.replace(reply, follows=first.request_id, think_s=1.0)
    client = Client([late, first, reply, middle])
    assert client.send() == (first, 0.0)
    client.complete(first.request_id, 0.5)  # its reply is due at 1.5 s: before the others
    sent = [client.send() for _ in range(3)]
    assert [(spec.request_id, sent_s) for spec, sent_s in sent] == [(reply.request_id, 1.5), (middle.request_id, 3.0),
                                                                    (late.request_id, 5.0)]
    assert not client.has_pending and client.next_delivery_s == math.inf


def test_a_conversations_next_turn_is_sent_its_think_time_after_the_last_answer():
    base = make_specs([(6, 3), (10, 2), (3000, 2), (14, 2), (6, 4)])  # turn 2 is longer than the context
    follows = [None, 0, 1, 2, None]
    specs = [dataclasses.replace(s, follows=f, think_s=0.25 if f is not None else 0.0) for s, f in zip(base, follows)]
    requests = run_client(specs, max_concurrency=None)
    assert requests[2].status == RequestStatus.REJECTED  # still sent, and the conversation goes on
    for turn, before in ((1, 0), (2, 1), (3, 2)):
        ended = requests[before].finish_s if requests[before].finish_s is not None else requests[before].sent_s
        assert requests[turn].sent_s == requests[turn].arrival_s == pytest.approx(ended + 0.25)
    assert requests[4].sent_s == 0.0  # another conversation starts at its own time
    assert all(r.status == RequestStatus.FINISHED for i, r in enumerate(requests) if i != 2)
