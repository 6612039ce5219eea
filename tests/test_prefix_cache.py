"""The prefix cache's bookkeeping: block names, hits, reference counts and eviction order."""

import json
from functools import cache, partial

import pandas as pd
import pytest

from harness.config import compose_config, validate
from harness.core.kv_cache import CACHE_POLICIES, BlockAllocator, CachePolicy
from harness.core.prefix_cache import prompt_block_hashes
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.job import run_job
from harness.sim.costmodel import hardware
from harness.sim.replica import simulated_engine, simulated_replicas
from harness.sim.router import make_router
from harness.sim.runner import SimRunner
from strategies import Request, RequestStatus
from tests.conftest import StepCost
from workloads import build_workload
from workloads.config import parse_workload


def request(rid: int, ids: list[int], pieces=(), with_ids: bool = True, outputs: int = 0) -> Request:
    prompt = len(ids)
    return Request(request_id=rid, arrival_s=0.0, token_ids=list(ids) + [0] * outputs if with_ids else [0] * outputs,
                   num_prompt_tokens=prompt, max_new_tokens=4, num_output_tokens=outputs, prefix_pieces=pieces)


def computed(allocator: BlockAllocator, r: Request, num_tokens: int) -> None:
    """As the engine does after a step: the request's tokens are computed and its full prompt blocks named."""
    r.num_computed_tokens = num_tokens
    allocator.cache_computed(r)


def test_a_block_is_named_by_its_tokens_and_everything_before_them():
    a, b = request(0, [1, 2, 3, 4, 5, 6, 7, 8, 9]), request(1, [9, 9, 9, 9, 5, 6, 7, 8])
    assert len(prompt_block_hashes(a, 4)) == 2  # full blocks only
    assert prompt_block_hashes(a, 4)[0] != prompt_block_hashes(b, 4)[0]
    assert prompt_block_hashes(a, 4)[1] != prompt_block_hashes(b, 4)[1]  # same tokens, different prefix
    assert prompt_block_hashes(a, 4) == prompt_block_hashes(request(2, [1, 2, 3, 4, 5, 6, 7, 8, 0, 0]), 4)


def test_without_ids_pieces_name_the_shared_blocks_and_the_rest_is_the_requests_own():
    shared = ((7, 6),)  # 6 tokens of piece 7, then each request's own
    a, b = (request(rid, [0] * 12, shared, with_ids=False) for rid in (0, 1))
    ha, hb = prompt_block_hashes(a, 4), prompt_block_hashes(b, 4)
    assert ha[0] == hb[0]  # inside the piece
    assert ha[1] != hb[1] and ha[2] != hb[2]  # the block where a's own tokens start, and every one after
    # The same piece cut to a prefix of its tokens names the same leading block.
    assert prompt_block_hashes(request(2, [0] * 4, ((7, 4),), with_ids=False), 4)[0] == ha[0]
    # Re-admitted after a preemption (outputs kept), a request names its prompt as before.
    assert prompt_block_hashes(request(0, [0] * 12, shared, with_ids=False, outputs=3), 4) == ha


def test_a_request_reuses_the_cached_prefix_never_its_last_token_and_shares_by_reference():
    allocator = BlockAllocator(num_blocks=10, block_size=4, prefix_caching=True)
    first = request(0, list(range(1, 13)))  # 3 full blocks
    assert allocator.num_cached_tokens(first) == 0 and allocator.allocate(first, 12)
    computed(allocator, first, 12)
    same = request(1, list(range(1, 13)))
    assert allocator.num_cached_tokens(same) == 8  # 2 of 3 blocks: the last token is computed to sample
    assert allocator.allocate(same, 12, 8)
    assert allocator.block_tables[1][:2] == allocator.block_tables[0][:2]
    assert allocator.num_used_blocks == 4  # 3 + 1 new: the shared two are held once
    allocator.free(first)
    assert allocator.num_used_blocks == 3  # the shared blocks stay held by the second request
    allocator.free(same)
    assert allocator.num_used_blocks == 0 and allocator.num_free_blocks == 10 and allocator.num_cached_blocks == 3
    assert all(count == 0 for count in allocator.prefix.ref_counts.values())


@pytest.mark.parametrize("engine, evictions, old_cached", [("vllm", 2, 0), ("sglang", 1, 2)])
def test_free_blocks_are_handed_out_in_the_engines_order_a_prefix_its_last_block_first(engine, evictions,
                                                                                        old_cached):
    allocator = BlockAllocator(num_blocks=6, block_size=2, prefix_caching=True, policy=CACHE_POLICIES[engine])
    old, new = request(0, [1, 2, 3, 4, 5]), request(1, [6, 7, 8, 9, 10])
    for r in (old, new):
        allocator.allocate(r, 5)
        computed(allocator, r, 5)
    allocator.free(old)
    allocator.free(new)
    assert allocator.num_cached_blocks == 4 and allocator.num_free_blocks == 6
    filler = request(2, [11, 12, 13, 14, 15, 16, 17])
    # 3 blocks. vLLM: in the order they were freed, old's unnamed last block, then its two named ones, last first.
    # SGLang: the 2 blocks holding nothing, then old's last named block.
    assert allocator.allocate(filler, 5)
    assert allocator.num_evictions == evictions
    assert allocator.num_cached_tokens(request(3, [1, 2, 3, 4, 5])) == old_cached  # a leading run, if any
    assert allocator.num_cached_tokens(request(4, [6, 7, 8, 9, 10])) == 4  # new is untouched


def test_a_preempted_request_finds_its_generated_blocks_where_the_engine_names_them():
    for engine, cached in (("vllm", 8), ("sglang", 4)):
        allocator = BlockAllocator(num_blocks=8, block_size=2, prefix_caching=True, policy=CACHE_POLICIES[engine])
        r = request(0, [1, 2, 3, 4, 5])
        allocator.allocate(r, 5)
        computed(allocator, r, 5)
        for token in (6, 7, 8, 9):  # sampled, each computed at the next step but the last
            r.token_ids.append(token)
            r.num_output_tokens += 1
            if token < 9:
                allocator.allocate(r, r.num_tokens)
                computed(allocator, r, r.num_tokens)
        allocator.free(r)  # preempted with 8 tokens computed, its ninth sampled
        r.num_computed_tokens = 0
        # vLLM named the blocks of its generated tokens too; SGLang keeps the prompt's full blocks.
        assert allocator.num_cached_tokens(r) == cached


def test_two_requests_computing_one_prefix_at_once_name_it_once():
    allocator = BlockAllocator(num_blocks=8, block_size=2, prefix_caching=True)
    a, b = request(0, [1, 2, 3, 4, 5]), request(1, [1, 2, 3, 4, 5])
    for r in (a, b):  # both entered before either was computed: neither finds the other
        assert allocator.num_cached_tokens(r) == 0 and allocator.allocate(r, 5)
    for r in (a, b):
        computed(allocator, r, 5)
    assert allocator.num_cached_blocks == 2  # a's blocks; b's copies stay its own
    allocator.free(b)
    assert allocator.num_free_blocks == 8 - 3 and allocator.num_cached_blocks == 2  # b's blocks went to the free list
    allocator.free(a)
    assert allocator.num_free_blocks == 8


def test_an_allocation_that_does_not_fit_takes_nothing_not_even_its_cached_blocks():
    allocator = BlockAllocator(num_blocks=4, block_size=2, prefix_caching=True)
    first = request(0, [1, 2, 3, 4, 5])
    allocator.allocate(first, 5)
    computed(allocator, first, 5)
    allocator.free(first)  # 2 named blocks, evictable
    holder = request(1, [9, 9, 9])
    allocator.allocate(holder, 3)  # takes the 2 free ones
    big = request(2, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    cached = allocator.num_cached_tokens(big)
    assert cached == 4 and not allocator.allocate(big, 9, cached)  # 2 cached + 3 new > 2 free
    assert allocator.num_used_blocks == 2 and allocator.num_cached_blocks == 2
    assert all(count == 0 for count in allocator.prefix.ref_counts.values())


@pytest.mark.parametrize("runner", [["runner=sim", "runner.hardware=cpu"], ["runner=real"]])
def test_a_shared_prefix_is_computed_once_and_answers_sooner(runner, tmp_path, monkeypatch):
    """The issue's command (prompts of 640 tokens, 512 shared), fewer requests for a real run in CI."""
    # Both simulated runs replay on one measurement of this CPU: measured for each, a busy moment during one of them
    # made it the slower machine (a run with the cache once came out 2.5 times its usual TTFT, behind the other).
    monkeypatch.setattr(hardware, "measure_cpu", cache(hardware.measure_cpu))

    def run(caching: bool) -> dict:
        return run_job(compose_config([*runner, "workload=random", "workload.prefix_len=512",
                                       "workload.input_len=128", "workload.output_len=32", "workload.num_requests=8",
                                       f"kv_cache.prefix_caching={str(caching).lower()}", "progress=false"]),
                       tmp_path / str(caching))

    on, off = run(True), run(False)
    # Every request but the first finds the 512 shared tokens: 7 x 512 of 8 x 640 prompt tokens.
    assert on["prefix_hit_rate_tokens"] == pytest.approx(7 * 512 / (8 * 640))
    assert on["prefix_hit_rate_requests"] == 7 / 8
    assert off["prefix_hit_rate_tokens"] == 0 and off["prefix_caching"] is False
    assert on["num_computed_tokens"] == off["num_computed_tokens"] - 7 * 512
    if "runner=sim" in runner:  # a real run's TTFT on this shared machine is a benchmark's figure, not a test's
        assert on["ttft_s_mean"] < off["ttft_s_mean"]
    assert (tmp_path / "True" / "plots" / "prefix_cache.png").exists()
    assert "## Prefix cache" in (tmp_path / "True" / "report.md").read_text()


def conversation_cluster(router: str, load_weight: float = 0.5) -> list:
    """Three step-by-step replicas with prefix caching behind `router`, replaying multi-turn conversations."""
    workload = build_workload(parse_workload({
        "name": "chat", "source": "conversation", "num_requests": 60, "seed": 0, "rate": 20.0,
        "turns": {"dist": "fixed", "value": 5}, "message_len": {"dist": "fixed", "value": 24},
        "answer_len": {"dist": "fixed", "value": 6}, "think_s": 0.05, "system_prompt_len": 8}), 1000, with_ids=False)
    engines = [build_replica("continuous", dict(max_batch_tokens=64, max_num_seqs=4),
                             lambda a: SimRunner(StepCost(0.01, per_token_s=1e-4)), num_blocks=200, block_size=4,
                             max_model_len=2048, prefix_caching=True,
                             engine_class=partial(simulated_engine, shared_prefixes=True)) for _ in range(3)]
    replay(engines, workload.requests, make_router(router, load_weight))
    return engines


def test_the_prefix_aware_router_sends_a_conversation_back_to_its_cache():
    hit_rates = {}
    for router in ("round_robin", "least_outstanding", "prefix_aware"):
        engines = conversation_cluster(router)
        requests = [r for e in engines for r in e.records.requests]
        assert sorted(r.request_id for r in requests) == list(range(60))
        assert all(r.status == RequestStatus.FINISHED for r in requests)
        hit_rates[router] = sum(r.num_cached_tokens for r in requests) / sum(r.num_prompt_tokens for r in requests)
    assert hit_rates["prefix_aware"] > 0.6 > max(hit_rates["round_robin"], hit_rates["least_outstanding"])
    # All weight on load: it balances like least-outstanding, and its hits are no longer the conversations' own.
    balanced = conversation_cluster("prefix_aware", load_weight=100.0)
    counts = sorted(len(e.records.requests) for e in balanced)
    assert counts[-1] - counts[0] <= 6


def test_a_run_writes_what_it_sent_as_a_mooncake_trace_that_replays_its_sharing(tmp_path):
    sim = ["runner=sim", "runner.hardware=cpu", "progress=false"]
    run_job(compose_config([*sim, "workload=agentic", "workload.num_requests=24", "save_trace=true"]), tmp_path / "a")
    trace = tmp_path / "a" / "trace.jsonl"
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    sent = pd.read_csv(tmp_path / "a" / "requests.csv").sort_values(["sent_s", "request_id"])
    assert [line["timestamp"] for line in lines] == [round(s * 1000, 3) for s in sent.sent_s]
    assert [line["input_length"] for line in lines] == sent.prompt_len.tolist()
    # A hash id per 512 tokens, the last block partly filled; a session's steps name their shared blocks alike.
    hash_ids = [line["hash_ids"] for line in lines]
    assert all(len(ids) == -(-line["input_length"] // 512) for ids, line in zip(hash_ids, lines))
    assert sum(map(len, hash_ids)) > len({i for ids in hash_ids for i in ids})  # requests share blocks
    replayed = run_job(compose_config([*sim, "workload=mooncake", f"workload.path={trace}"]), tmp_path / "b")
    assert replayed["num_finished"] == 24 and replayed["prefix_hit_rate_tokens"] > 0.3


@pytest.mark.parametrize("overrides, eviction, names_output", [
    ([], "release_order", True), (["runner.engine=sglang"], "empty_first", False),
    (["kv_cache.eviction=empty_first"], "empty_first", True)])
def test_a_run_keeps_its_cache_as_its_engine_does_unless_told(overrides, eviction, names_output):
    cfg = validate(compose_config(["runner=sim", "runner.hardware=h100", "model=llama-2-7b", *overrides]))
    replicas, *_ = simulated_replicas(cfg)
    assert replicas[0].allocator.policy == CachePolicy(eviction, names_output)
