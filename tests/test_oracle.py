"""The correctness oracle: every strategy's greedy tokens equal transformers' `generate()` per request."""

import pytest
import torch

from harness.real import attention
from strategies import RequestStatus
from tests.conftest import make_specs, run_engine
from workloads import RequestSpec

# Awkward on purpose: prompts of 1 token and longer than the token budget, outputs of 1 token, mixed lengths.
LENGTHS = [(11, 6), (1, 5), (23, 3), (5, 1), (17, 9), (8, 4)]

SETTINGS = {
    "static-b3-bs3": ("static", dict(block_size=3, batch_size=3)),
    "static-b1-bs1": ("static", dict(block_size=1, batch_size=1)),
    "dynamic-b3-bs1": ("dynamic", dict(block_size=1, batch_size=3)),
    "dynamic-b4-bs3": ("dynamic", dict(block_size=3, batch_size=4)),
    "continuous-chunked-bs3": ("continuous", dict(block_size=3, max_batch_tokens=7, max_num_seqs=4)),
    "continuous-bs1": ("continuous", dict(block_size=1, max_batch_tokens=64, max_num_seqs=6)),
    "continuous-prefill-first": ("continuous", dict(block_size=3, max_batch_tokens=10, max_num_seqs=3,
                                                    order="prefill_first", max_prefill_chunk=4)),
    # 12 blocks of 3 slots hold 36 tokens; six requests want ~90: preemption by recompute must kick in.
    "continuous-preempting": ("continuous", dict(block_size=3, num_blocks=12, max_batch_tokens=32, max_num_seqs=6)),
    # SGLang's schedule in that small cache: prefill batches apart, admission against a reserve for output to come.
    "continuous-sglang": ("continuous", dict(block_size=3, num_blocks=12, max_batch_tokens=32, max_num_seqs=6,
                                             scheduler="sglang")),
}

_generated: dict = {}


def generate(model, spec):
    """`generate()` on one request alone: (tokens, per-token logits)."""
    key = (spec.prompt_ids, spec.max_new_tokens)
    if key not in _generated:
        out = model.generate(torch.tensor([spec.prompt_ids]), max_new_tokens=spec.max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        tokens = out.sequences[0, len(spec.prompt_ids):].tolist()
        _generated[key] = (tokens, torch.stack([step[0] for step in out.logits]))
    return _generated[key]


def assert_matches_generate(records, runner, reference_model, specs):
    assert len(records.requests) == len(specs)
    for request, spec in zip(sorted(records.requests, key=lambda r: r.request_id), specs):
        tokens, logits = generate(reference_model, spec)
        assert request.status == RequestStatus.FINISHED
        assert request.output_ids == tokens, f"request {spec.request_id}"
        if runner.logits:
            ours = torch.stack(runner.logits[spec.request_id])  # [max_new_tokens, V]
            torch.testing.assert_close(ours, logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_strategy_matches_generate(setting, runner_model, reference_model):
    strategy, options = SETTINGS[setting]
    specs = make_specs(LENGTHS)
    records, engine, runner = run_engine(runner_model, specs, strategy, keep_logits=True, **options)
    assert len(runner.logits) == len(specs)  # the logits check below really ran
    assert_matches_generate(records, runner, reference_model, specs)
    assert engine.allocator.num_used_blocks == 0
    if setting == "continuous-preempting":
        assert sum(r.num_preemptions for r in records.requests) > 0


def test_staggered_arrivals_match_generate(runner_model, reference_model):
    specs = make_specs(LENGTHS, arrivals=[0.0, 0.0, 0.01, 0.02, 0.5, 0.5])
    for strategy, options in (("dynamic", dict(batch_size=2)), ("continuous", dict(max_batch_tokens=9, max_num_seqs=3)),
                              # SGLang's scheduler taking arrivals in every third decode batch
                              ("continuous", dict(max_batch_tokens=9, max_num_seqs=3, scheduler="sglang",
                                                  recv_interval=3))):
        records, _, runner = run_engine(runner_model, specs, strategy, block_size=3, **options)
        assert_matches_generate(records, runner, reference_model, specs)


def shared_prefix_specs() -> list[RequestSpec]:
    """Prompts that share prefixes of several lengths (one whole prompt is another's prefix, two are the same),
    arriving in waves so later ones find the earlier ones' blocks cached."""
    gen = torch.Generator().manual_seed(1)
    system, other = torch.randint(0, 8192, (14,), generator=gen).tolist(), torch.randint(0, 8192, (7,), generator=gen)
    own = [torch.randint(0, 8192, (n,), generator=gen).tolist() for n in (5, 9, 1, 12, 3, 6)]
    prompts = [system + own[0], system + own[1], system[:9], system + own[0], other.tolist() + own[3],
               system + own[4] + own[5], system[:9] + own[2], other.tolist() + own[3][:4]]
    outputs = [5, 3, 6, 4, 2, 7, 1, 5]
    arrivals = [0.0, 0.0, 0.05, 0.1, 0.1, 0.3, 0.3, 0.6]
    return [RequestSpec(i, t, tuple(p), m) for i, (p, m, t) in enumerate(zip(prompts, outputs, arrivals))]


@pytest.mark.parametrize("strategy,options", [
    ("static", dict(block_size=3, batch_size=2)),
    ("dynamic", dict(block_size=3, batch_size=3)),
    ("continuous", dict(block_size=3, max_batch_tokens=8, max_num_seqs=4)),
    # 14 blocks of 3: requests evict each other's cached prefixes, and preempt.
    ("continuous", dict(block_size=3, num_blocks=14, max_batch_tokens=32, max_num_seqs=4)),
])
def test_prefix_caching_matches_generate(strategy, options, runner_model, reference_model):
    specs = shared_prefix_specs()
    records, engine, runner = run_engine(runner_model, specs, strategy, keep_logits=True, prefix_caching=True,
                                         **options)
    assert_matches_generate(records, runner, reference_model, specs)
    cached = {r.request_id: r.num_cached_tokens for r in records.requests}
    assert cached[3] >= 12 and sum(cached.values()) >= 30  # the repeated prompt, and the shared system prompt
    assert engine.allocator.num_used_blocks == 0
    assert all(count == 0 for count in engine.allocator.prefix.ref_counts.values())
    if options.get("num_blocks") == 14:
        assert engine.allocator.num_evictions > 0 and sum(r.num_preemptions for r in records.requests) > 0


def test_oracle_catches_attention_leaking_across_requests(runner_model, reference_model, monkeypatch):
    """Prove the oracle can fail: attention that also reads the previous sequence's blocks must be caught."""
    honest = attention.ragged_paged_attention

    def leaky(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, block_table, *args):
        # Sequence i attends through sequence i-1's block table: a wrong-block read.
        shifted = torch.roll(block_table, shifts=1, dims=0).clamp(min=0)
        return honest(q, k_cache, v_cache, cu_seqlens_q, seq_lens_k, shifted, *args)

    monkeypatch.setattr(attention, "ragged_paged_attention", leaky)
    specs = make_specs(LENGTHS)
    records, _, runner = run_engine(runner_model, specs, "continuous", max_batch_tokens=64, max_num_seqs=6)
    with pytest.raises(AssertionError):
        assert_matches_generate(records, runner, reference_model, specs)


def test_the_runner_on_the_triton_kernels_matches_generate(runner_model, reference_model):
    """The runner's Triton path end to end (interpreted on CPU): a mixed batch of chunked prefills and decodes."""
    specs = make_specs([(9, 3), (4, 4), (14, 2)])
    records, _, runner = run_engine(runner_model, specs, "continuous", block_size=4, keep_logits=True,
                                    kernel_backend="triton", max_batch_tokens=12, max_num_seqs=3)
    assert_matches_generate(records, runner, reference_model, specs)
