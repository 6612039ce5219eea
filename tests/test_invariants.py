"""The engine's invariants on random workloads, caches, budgets and clusters, through every strategy on the
simulated runner: nothing lost, no leak, budgets and caps never exceeded, clocks that only move forward, counts
that add up, and the simulated engines making exactly the records of the step-by-step engine.

A few hundred cases run by default; `pytest -m slow` runs ten thousand.
"""

from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.engine import Engine
from harness.core.kv_cache import EVICTION_ORDERS, WindowBlocks
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.sim.replica import simulated_engine
from harness.sim.router import ROUTERS
from harness.sim.runner import SimRunner
from strategies import RequestStatus
from tests.conftest import StepCost, assert_same_records
from workloads import RequestSpec


@st.composite
def scenarios(draw):
    strategy = draw(st.sampled_from(["static", "dynamic", "continuous"]))
    concurrency = draw(st.integers(1, 8))
    scheduler = draw(st.sampled_from(["vllm", "sglang"])) if strategy == "continuous" else "vllm"
    if strategy == "continuous":
        options = {"max_batch_tokens": draw(st.integers(1, 96)), "max_num_seqs": concurrency,
                   "max_prefill_chunk": draw(st.none() | st.integers(1, 48)),
                   "order": draw(st.sampled_from(["decode_first", "prefill_first"]))}
    else:
        options = {"batch_size": concurrency}
    n = draw(st.integers(1, 24))
    lengths = draw(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    arrivals = [sum(gaps[:i + 1]) for i in range(n)]
    prefix_caching = draw(st.booleans())  # shared prefixes come with a smaller cache: hits, evictions, preemption
    eviction = draw(st.sampled_from(["auto", *EVICTION_ORDERS]))
    # A linear-attention state held by each running sequence, and sliding-window layers' blocks beside the full
    # layers' (up to a window's cap, 1-3 window layers to 1-3 full ones: gpt-oss's 1:1, or fewer or more).
    state_blocks = draw(st.sampled_from([0, 0, 1, 4]))
    window = draw(st.none() | st.builds(WindowBlocks, st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)))
    # Shared prefixes (one of a few, or none) as pieces with matching ids; or every prompt its own.
    shared = prefix_caching and draw(st.booleans())
    prefixes = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)) if shared else [0] * n
    keys = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    specs = []
    for i, ((p, m), k, shared_len) in enumerate(zip(lengths, keys, prefixes)):
        shared_len = min(shared_len, p)
        ids = tuple(1000 * (k + 1) + t for t in range(shared_len)) + tuple(100_000 * (i + 1) + t for t in
                                                                           range(p - shared_len))
        pieces = ((k, shared_len),) if shared_len else ()
        specs.append(RequestSpec(i, arrivals[i], ids, m, prefix_pieces=pieces))
    return {
        "prefix_caching": prefix_caching, "eviction": eviction, "shared": shared, "state_blocks": state_blocks,
        "window": window,
        "strategy": strategy, "scheduler": scheduler, "options": options, "specs": specs,
        "block_size": draw(st.integers(1, 16)), "num_blocks": draw(st.integers(concurrency, 48 if shared else 160)),
        "max_model_len": draw(st.integers(8, 128)), "replicas": draw(st.integers(1, 3)),
        "router": draw(st.sampled_from(sorted(ROUTERS))), "max_concurrency": draw(st.none() | st.integers(1, 6)),
        "cost": StepCost(draw(st.sampled_from([0.001, 0.01])), per_token_s=draw(st.sampled_from([0.0, 1e-4])),
                         per_pair_s=draw(st.sampled_from([0.0, 1e-6])), step_overhead_s=0.0005),
    }


def run(scenario: dict, engine_class) -> list:
    engines = [build_replica(scenario["strategy"], scenario["options"], lambda a: SimRunner(scenario["cost"]),
                             num_blocks=scenario["num_blocks"], block_size=scenario["block_size"],
                             max_model_len=scenario["max_model_len"], engine_class=engine_class,
                             prefix_caching=scenario["prefix_caching"], scheduler=scenario["scheduler"],
                             eviction=scenario["eviction"], state_blocks=scenario["state_blocks"],
                             window=scenario["window"])
               for _ in range(scenario["replicas"])]
    route = ROUTERS[scenario["router"]]() if len(engines) > 1 else None
    replay(engines, scenario["specs"], route, max_concurrency=scenario["max_concurrency"])
    return engines


def check_invariants(scenario: dict) -> None:
    engines = run(scenario, Engine)
    specs = {s.request_id: s for s in scenario["specs"]}
    options = scenario["options"]
    # Nothing lost: every request that arrived is in exactly one replica's records, finished or rejected.
    records = [r for e in engines for r in e.records.requests]
    assert sorted(r.request_id for r in records) == sorted(specs)
    for r in records:
        spec = specs[r.request_id]
        if r.status == RequestStatus.REJECTED:
            assert r.reject_reason and not r.token_times_s
            continue
        assert r.status == RequestStatus.FINISHED
        assert r.num_output_tokens == spec.max_new_tokens == len(r.token_times_s)
        assert r.arrival_s <= r.first_scheduled_s < r.token_times_s[0]
        assert all(a < b for a, b in zip(r.token_times_s, r.token_times_s[1:]))
        assert r.finish_s == r.token_times_s[-1]
    for engine in engines:
        assert engine.allocator.num_used_blocks == 0  # no leak
        prefix = engine.allocator.prefix
        if prefix is not None:  # every reference given back; every block free, each cached one named once
            assert all(count == 0 for count in prefix.ref_counts.values())
            assert set(prefix.hash_of) == set(prefix.block_of.values()) <= set(engine.allocator._free)
            assert len(prefix.hash_of) == len(prefix.block_of)
        assert sorted(engine.allocator._free) == list(range(scenario["num_blocks"]))  # each block once
        assert not engine.waiting and not engine.running
        steps = list(engine.records.steps.frame().itertuples())
        for s, after in zip(steps, steps[1:]):  # the clock only moves forward, by each step's duration at least
            assert after.start_s >= s.start_s + s.duration_s - 1e-12
        for s in steps:
            assert 0 < s.kv_used_blocks <= scenario["num_blocks"]
            if scenario["scheduler"] == "sglang":  # a prefill batch under the budget, or a decode batch of any size
                assert s.num_padding_tokens == 0 and not (s.num_prefill_tokens and s.num_decode_tokens)
                assert s.num_prefill_tokens <= options["max_batch_tokens"]
                assert s.num_seqs <= options["max_num_seqs"]
            elif scenario["strategy"] == "continuous":
                assert s.num_padding_tokens == 0
                assert s.num_prefill_tokens + s.num_decode_tokens <= options["max_batch_tokens"]
                assert s.num_seqs <= options["max_num_seqs"]
            else:
                assert s.num_rows <= options["batch_size"]
    # Counts add up: every token computed once, more only when preemption made a request recompute.
    finished = [r for r in records if r.status == RequestStatus.FINISHED]
    needed = sum(r.num_prompt_tokens + r.num_output_tokens - 1 for r in finished)
    computed = sum(int(e.records.steps.column(c).sum()) for e in engines
                   for c in ("num_prefill_tokens", "num_decode_tokens"))
    cached = sum(int(e.records.steps.column("num_cached_tokens").sum()) for e in engines)
    assert sum(r.num_cached_tokens or 0 for r in records) <= cached  # first admissions, and re-admissions
    preempted = sum(r.num_preemptions for r in records)
    assert computed + cached == needed if not preempted else computed + cached > needed
    if not scenario["prefix_caching"]:
        assert cached == 0
    assert_same_records(engines, run(scenario, partial(simulated_engine, shared_prefixes=scenario["shared"])))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_engine_invariants_on_random_scenarios(scenario):
    check_invariants(scenario)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_engine_invariants_on_ten_thousand_random_scenarios(scenario):
    check_invariants(scenario)
