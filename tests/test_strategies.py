"""Scheduling invariants, checked without a model: padding accounting, budgets, preemption, no leaks."""

from collections import deque
from dataclasses import fields

import pytest

from harness.core.kv_cache import BlockAllocator
from strategies import ContinuousBatching, DynamicBatching, Request, RequestStatus
from tests.conftest import make_specs, run_schedule


def decoding_request(request_id: int, prompt_len: int, num_output: int, max_new: int = 100) -> Request:
    """A request mid-decode: prompt and all outputs but the last computed."""
    request = Request(request_id=request_id, arrival_s=0.0, token_ids=[1] * (prompt_len + num_output),
                      num_prompt_tokens=prompt_len, max_new_tokens=max_new, num_output_tokens=num_output,
                      status=RequestStatus.RUNNING)
    request.num_computed_tokens = request.num_tokens - 1
    return request


def test_dynamic_insertion_costs_the_blogs_693_pads():
    """Inserting a 100-token prompt into 8 rows (7 decoding) costs (100 - 1) * (8 - 1) = 693 padding tokens."""
    allocator = BlockAllocator(num_blocks=1024, block_size=16)
    strategy = DynamicBatching(allocator, batch_size=8)
    running = [decoding_request(i, prompt_len=20, num_output=3) for i in range(7)]
    for r in running:
        allocator.allocate(r, r.max_num_tokens)
    newcomer = Request(request_id=99, arrival_s=0.0, token_ids=[1] * 100, num_prompt_tokens=100, max_new_tokens=10)
    plan = strategy.schedule(deque([newcomer]), running)
    assert (plan.num_rows, plan.row_width) == (8, 100)
    assert plan.num_padding_tokens == 693
    assert plan.num_scheduled_tokens == 107


def test_continuous_computes_no_padding_and_respects_the_budget():
    specs = make_specs([(40, 5), (3, 9), (70, 2), (12, 12), (25, 4)] * 3)
    records, runner, allocator = run_schedule(specs, "continuous", max_batch_tokens=32, max_num_seqs=4)
    assert all(not p.padded and p.num_padding_tokens == 0 for p in runner.plans)
    assert all(p.num_scheduled_tokens <= 32 for p in runner.plans)
    assert all(len(p.chunks) <= 4 for p in runner.plans)
    assert max(p.num_scheduled_tokens for p in runner.plans) == 32  # a prompt over budget was chunked to fit
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)
    assert allocator.num_used_blocks == 0


def test_continuous_schedules_decodes_before_prefill():
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    strategy = ContinuousBatching(allocator, max_batch_tokens=6, max_num_seqs=8)
    running = [decoding_request(i, prompt_len=5, num_output=2) for i in range(4)]
    for r in running:
        allocator.allocate(r, r.num_computed_tokens)
    waiting = deque([Request(request_id=9, arrival_s=0.0, token_ids=[1] * 50, num_prompt_tokens=50,
                             max_new_tokens=3)])
    plan = strategy.schedule(waiting, running)
    assert [c.num_tokens for c in plan.chunks] == [1, 1, 1, 1, 2]  # every decode, then a 2-token prefill chunk
    assert plan.chunks[-1].request.request_id == 9


@pytest.mark.parametrize("admission, enters", [("next_chunk", True), ("whole_prompt", False)])
def test_whole_prompt_admission_waits_for_room_for_all_of_a_prompt(admission, enters):
    # 10 blocks of 4 slots, 8 held by two decoders: a 40-token prompt's 6-token chunk fits, all of it does not.
    allocator = BlockAllocator(num_blocks=10, block_size=4)
    strategy = ContinuousBatching(allocator, max_batch_tokens=8, max_num_seqs=8, admission=admission)
    running = [decoding_request(i, prompt_len=13, num_output=2) for i in range(2)]
    for r in running:
        allocator.allocate(r, r.num_computed_tokens + 1)
    waiting = deque([Request(request_id=9, arrival_s=0.0, token_ids=[1] * 40, num_prompt_tokens=40,
                             max_new_tokens=3)])
    plan = strategy.schedule(waiting, running)
    assert [c.num_tokens for c in plan.chunks] == ([1, 1, 6] if enters else [1, 1])
    assert not plan.preempted and (plan.admitted == [waiting[0]]) == enters


def test_static_padding_is_idle_rows_plus_left_padding():
    lengths = [(10, 3), (4, 8), (7, 5)]
    records, runner, _ = run_schedule(make_specs(lengths), "static", batch_size=3)
    longest_prompt, longest_output = max(p for p, _ in lengths), max(n for _, n in lengths)
    left_padding = sum(longest_prompt - p for p, _ in lengths)
    # Decode steps: longest_output - 1 of them, each with one row per request already done.
    idle_rows = sum(sum(1 for _, n in lengths if n <= step) for step in range(1, longest_output))
    assert sum(p.num_padding_tokens for p in runner.plans) == left_padding + idle_rows
    assert len(runner.plans) == longest_output


def test_static_holds_the_rectangle_until_the_batch_drains():
    records, runner, allocator = run_schedule(make_specs([(10, 2), (4, 9)]), "static", block_size=1, batch_size=2)
    used = records.steps.column("kv_used_blocks").tolist()
    assert used == [2 * (10 + 9 - 1)] * len(used)  # [B, L + max_new - 1] slots for every step
    assert allocator.num_used_blocks == 0


@pytest.mark.parametrize("strategy,options", [("static", dict(batch_size=4)), ("dynamic", dict(batch_size=4)),
                                              ("continuous", dict(max_batch_tokens=16, max_num_seqs=4))])
def test_small_cache_never_drops_a_request(strategy, options):
    specs = make_specs([(30, 20), (8, 40), (25, 10), (5, 5), (40, 30), (12, 12)])
    records, _, allocator = run_schedule(specs, strategy, block_size=4, num_blocks=20, **options)
    assert sorted(r.request_id for r in records.requests) == list(range(len(specs)))
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)
    assert all(r.num_output_tokens == r.max_new_tokens for r in records.requests)
    assert allocator.num_used_blocks == 0


def test_continuous_preempts_the_newest_and_finishes_everyone():
    specs = make_specs([(20, 30)] * 4)
    records, runner, _ = run_schedule(specs, "continuous", block_size=4, num_blocks=30, max_batch_tokens=64,
                                      max_num_seqs=4)
    first_preempted = next(p.preempted for p in runner.plans if p.preempted)
    assert first_preempted[0].request_id == 3  # newest first
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)


def test_unservable_requests_are_rejected_with_a_reason_and_the_rest_run():
    specs = make_specs([(10, 5), (60, 10), (8, 4), (30, 30)])
    records, _, _ = run_schedule(specs, "continuous", block_size=4, num_blocks=10, max_model_len=64,
                                 max_batch_tokens=32, max_num_seqs=4)
    by_id = {r.request_id: r for r in records.requests}
    assert by_id[1].status == RequestStatus.REJECTED and "context of 64" in by_id[1].reject_reason
    assert by_id[3].status == RequestStatus.REJECTED and "KV blocks" in by_id[3].reject_reason
    assert by_id[0].status == by_id[2].status == RequestStatus.FINISHED


def test_idle_engine_jumps_to_the_next_arrival():
    specs = make_specs([(4, 2), (4, 2)], arrivals=[0.0, 10.0])
    records, _, _ = run_schedule(specs, "continuous", max_batch_tokens=16, max_num_seqs=2)
    late = records.requests[1]
    assert late.token_times_s[0] == pytest.approx(10.0 + 0.01)  # one 10 ms step after it arrived
    assert records.steps.column("start_s")[-1] >= 10.0


def snapshot(queues):
    """Every field of every request in the queues, and the queues' order."""
    return [[(id(r), {f.name: (list(v) if isinstance(v := getattr(r, f.name), list) else v) for f in fields(r)})
             for r in q] for q in queues]


@pytest.mark.parametrize("strategy,options,scheduler", [
    ("static", dict(batch_size=3), "vllm"), ("dynamic", dict(batch_size=3), "vllm"),
    ("continuous", dict(max_batch_tokens=12, max_num_seqs=4), "vllm"),
    ("continuous", dict(max_batch_tokens=12, max_num_seqs=4), "sglang"),
])
def test_strategies_only_read_requests_and_queues(strategy, options, scheduler):
    """The engine is the one writer of request state: a strategy's `schedule` reports admissions and preemptions
    in its plan and changes nothing itself (a small cache makes continuous preempt)."""
    specs = make_specs([(9, 12), (3, 20), (14, 6), (5, 15), (11, 9), (2, 30)], arrivals=[0, 0, 0, 0.05, 0.05, 0.1])
    seen = {"plans": 0, "preempted": 0}

    def checked(schedule):
        def wrapper(waiting, running):
            before = snapshot([waiting, running])
            plan = schedule(waiting, running)
            assert snapshot([waiting, running]) == before
            assert plan.admitted == list(waiting)[:len(plan.admitted)]
            assert all(any(r is p for r in running) for p in plan.preempted)
            seen["plans"] += 1
            seen["preempted"] += len(plan.preempted)
            return plan
        return wrapper

    from harness.core.replica import build_replica
    from tests.conftest import ScriptedRunner

    engine = build_replica(strategy, options, lambda a: ScriptedRunner(), num_blocks=14, block_size=4,
                           max_model_len=2048, scheduler=scheduler)
    engine.strategy.schedule = checked(engine.strategy.schedule)
    records = engine.run(specs)
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)
    assert seen["plans"] == len(records.steps)
    if scheduler == "vllm" and strategy == "continuous":
        assert seen["preempted"] > 0  # the preemption path was checked too (SGLang's reserve keeps it from one here)


def test_any_of_several_eos_ids_ends_a_request():
    """Llama-3 lists several EOS ids; a request stops at whichever it samples first."""
    records, _, _ = run_schedule(make_specs([(5, 10), (7, 10)]), "continuous", max_batch_tokens=16,
                                 max_num_seqs=2, eos_token_ids=[3, 7])  # the scripted runner samples 7
    assert [r.num_output_tokens for r in records.requests] == [1, 1]
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)


def test_sglang_runs_prefill_batches_apart_and_finishes_everyone():
    """SGLang's schedule: a step admits and prefills, or decodes, never both; every request finishes, no leak."""
    specs = make_specs([(40, 5), (3, 9), (70, 2), (12, 12), (25, 4)] * 3, arrivals=[0.01 * i for i in range(15)])
    records, runner, allocator = run_schedule(specs, "continuous", num_blocks=40, max_batch_tokens=32,
                                              max_num_seqs=4, scheduler="sglang")
    decoding = [all(c.is_decode for c in p.chunks) for p in runner.plans]
    prefilling = [not any(c.is_decode for c in p.chunks) for p in runner.plans]
    assert all(d or p for d, p in zip(decoding, prefilling)) and any(decoding) and any(prefilling)
    assert all(p.num_scheduled_tokens <= 32 and len(p.chunks) <= 4 for p in runner.plans)
    assert all(r.status == RequestStatus.FINISHED for r in records.requests)
    assert allocator.num_used_blocks == 0


def test_sglang_admits_against_a_reserve_for_the_running_requests_output_to_come():
    """Four requests decoding with 98 tokens each to come: at SGLang's starting ratio, 0.7, they reserve 274 of the
    cache's 230 free slots, so a 12-token newcomer waits though its blocks fit (vLLM's schedule takes it); once the
    ratio has decayed to its floor, 0.098, they reserve 38 and it enters."""
    from strategies.sglang import MIN_NEW_TOKEN_RATIO, SGLangBatching

    newcomer = Request(request_id=9, arrival_s=0.0, token_ids=[1] * 8, num_prompt_tokens=8, max_new_tokens=4)
    admitted = {}
    for policy in (SGLangBatching, ContinuousBatching):
        allocator = BlockAllocator(num_blocks=64, block_size=4)
        strategy = policy(allocator, max_batch_tokens=64, max_num_seqs=8)
        running = [decoding_request(i, prompt_len=10, num_output=2) for i in range(4)]
        for r in running:
            allocator.allocate(r, r.num_computed_tokens)
        assert allocator.num_free_blocks * 4 == 256 - 4 * 12
        admitted[policy] = strategy.schedule(deque([newcomer]), running).admitted
    assert admitted == {SGLangBatching: [], ContinuousBatching: [newcomer]}
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    strategy = SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8)
    strategy.new_token_ratio = MIN_NEW_TOKEN_RATIO
    running = [decoding_request(i, prompt_len=10, num_output=2) for i in range(4)]
    for r in running:
        allocator.allocate(r, r.num_computed_tokens)
    plan = strategy.schedule(deque([newcomer]), running)
    assert plan.admitted == [newcomer] and all(not c.is_decode for c in plan.chunks)  # a prefill batch, alone


def test_sglang_with_a_receive_interval_takes_new_requests_in_every_that_many_decode_batches():
    """--scheduler-recv-interval 10: under decoding, a request that arrived waits until the tenth decode batch since
    the last take; a prefill batch makes the next step take at once, and so does an idle engine. At the default, 1,
    it enters at the next step."""
    from strategies.sglang import SGLangBatching

    def steps_until_admitted(interval, decodes_before):
        allocator = BlockAllocator(num_blocks=64, block_size=4)
        strategy = SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8, recv_interval=interval)
        running = [decoding_request(0, prompt_len=10, num_output=2)]
        allocator.allocate(running[0], running[0].num_computed_tokens)
        strategy.new_token_ratio = 0.0  # no reserve: only the receive holds the newcomer back
        for _ in range(decodes_before):
            assert not strategy.schedule(deque(), running).admitted
        newcomer = Request(request_id=9, arrival_s=0.0, token_ids=[1] * 8, num_prompt_tokens=8, max_new_tokens=4)
        for steps in range(1, 30):
            if strategy.schedule(deque([newcomer]), running).admitted == [newcomer]:
                return steps
        raise AssertionError("never admitted")

    # The first step takes in (the counter starts full); then every tenth decode batch.
    assert steps_until_admitted(1, 3) == 1 and steps_until_admitted(10, 0) == 1
    assert [steps_until_admitted(10, n) for n in (1, 3, 9, 10, 12)] == [10, 8, 2, 1, 9]
    allocator = BlockAllocator(num_blocks=64, block_size=4)
    strategy = SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8, recv_interval=10)
    first, second = (Request(request_id=i, arrival_s=0.0, token_ids=[1] * 8, num_prompt_tokens=8, max_new_tokens=4)
                     for i in (1, 2))
    assert strategy.schedule(deque([first]), []).admitted == [first]  # idle: taken in at once
    strategy.kv.allocate(first, 8)
    first.num_computed_tokens = 8
    first.num_output_tokens = 1
    assert strategy.schedule(deque([second]), [first]).admitted == [second]  # after a prefill batch: at once
    with pytest.raises(ValueError, match="receive interval must be at least 1 step, got 0"):
        SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8, recv_interval=0)


def test_sglang_learns_its_ratio_from_decode_batches_and_retractions():
    """The ratio falls from 0.7 to 0.098 over 600 decode batches. A decode batch short of cache retracts the
    requests with the fewest output tokens (ties: the longest prompt) until 20 tokens each fit for the rest, and
    the ratio becomes the share of their output budgets the rest have used: (outputs + 20 each) / (budgets + 1)."""
    from strategies.sglang import INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, SGLangBatching

    allocator = BlockAllocator(num_blocks=64, block_size=4)
    strategy = SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8)
    running = [decoding_request(0, prompt_len=10, num_output=2)]
    allocator.allocate(running[0], running[0].num_computed_tokens)
    strategy.schedule(deque(), running)
    assert strategy.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - (0.7 - 0.098) / 600)
    for _ in range(700):
        strategy.schedule(deque(), running)
    assert strategy.new_token_ratio == pytest.approx(MIN_NEW_TOKEN_RATIO) == pytest.approx(0.098)

    # Block size 4: each request's 12 tokens fill 3 blocks and its next token opens a fourth; none is free.
    allocator = BlockAllocator(num_blocks=9, block_size=4)
    strategy = SGLangBatching(allocator, max_batch_tokens=64, max_num_seqs=8)
    running = [decoding_request(0, prompt_len=8, num_output=5), decoding_request(1, prompt_len=10, num_output=3),
               decoding_request(2, prompt_len=9, num_output=4)]
    for r in running:
        assert allocator.allocate(r, r.num_computed_tokens)
    assert allocator.num_free_blocks == 0
    plan = strategy.schedule(deque(), running)
    assert [r.request_id for r in plan.preempted] == [1, 2]  # fewest outputs first, until 20 x 1 tokens fit
    assert [c.request.request_id for c in plan.chunks] == [0]
    assert strategy.new_token_ratio == pytest.approx((5 + 20) / (100 + 1))


def test_sglang_retracts_a_chunked_prompt_holding_the_block_its_last_decoder_needs():
    """A tiny cache: the one decoder's next token opens a block, and a prompt being chunked holds every free one.
    Retracting decoders cannot help (there is one); the chunked prompt goes back to the queue instead, newest
    first, and the decoder runs: the engine never stands still with work to do."""
    from strategies.sglang import SGLangBatching

    allocator = BlockAllocator(num_blocks=6, block_size=4)
    strategy = SGLangBatching(allocator, max_batch_tokens=8, max_num_seqs=4)
    decoder = decoding_request(0, prompt_len=8, num_output=1)  # 8 computed: its 9th token opens a third block
    chunked = [Request(request_id=i, arrival_s=0.0, token_ids=[1] * 30, num_prompt_tokens=30, max_new_tokens=4,
                       num_computed_tokens=8) for i in (1, 2)]
    assert allocator.allocate(decoder, 8) and all(allocator.allocate(r, 8) for r in chunked)
    assert allocator.num_free_blocks == 0
    plan = strategy.schedule(deque(), [decoder, *chunked])
    assert [r.request_id for r in plan.preempted] == [2]  # the newest chunked prompt: two blocks free one
    assert [(c.request.request_id, c.num_tokens) for c in plan.chunks] == [(0, 1)]
