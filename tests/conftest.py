"""Shared fixtures: the default tiny model (runner copy and reference copy), request makers, and the two test
doubles every engine test uses — `StepCost`, a cost model with known coefficients, and `ScriptedRunner`."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from harness.analysis import metrics
from harness.core.replica import build_replica
from harness.real.model import build_random_model, model_config
from harness.real.runner import RealRunner
from harness.sim.costmodel import step_shape
from harness.sim.engine_profile import EngineProfile
from workloads import RequestSpec

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model_cfg():
    return OmegaConf.load(ROOT / "conf" / "model" / "tiny-llama.yaml")


@pytest.fixture(scope="session")
def runner_model(tiny_model_cfg):
    return build_random_model(model_config(tiny_model_cfg), tiny_model_cfg.seed).eval()


@pytest.fixture(scope="session")
def reference_model(tiny_model_cfg):
    """A second copy with transformers' own attention, for `generate()`."""
    model = build_random_model(model_config(tiny_model_cfg), tiny_model_cfg.seed).eval()
    model.set_attn_implementation("sdpa")
    return model


def make_specs(lengths: list[tuple[int, int]], vocab_size: int = 8192, seed: int = 0,
               arrivals: list[float] | None = None) -> list[RequestSpec]:
    """Requests with seeded random prompts: `lengths` is [(prompt_len, max_new_tokens), ...]."""
    gen = torch.Generator().manual_seed(seed)
    return [
        RequestSpec(request_id=i, arrival_s=arrivals[i] if arrivals else 0.0,
                    prompt_ids=tuple(torch.randint(0, vocab_size, (p,), generator=gen).tolist()), max_new_tokens=n)
        for i, (p, n) in enumerate(lengths)
    ]


class StepCost:
    """A cost model with known coefficients: fixed + per computed token + per query-key pair, plus an overhead.
    Growing with the step's shape, so a simulation that got a step's shape wrong gets its duration wrong too."""

    def __init__(self, fixed_s: float = 0.01, per_token_s: float = 0.0, per_pair_s: float = 0.0,
                 step_overhead_s: float = 0.0):
        self.fixed_s, self.per_token_s, self.per_pair_s = fixed_s, per_token_s, per_pair_s
        self.step_overhead_s = step_overhead_s

    def predict(self, shape) -> float:
        # Decode pairs cost a little more than prefill ones (MLA's absorbed attention), and masked ones nothing (a
        # causal kernel skips them): a shape that miscounts either is timed wrong too.
        return (self.fixed_s + self.per_token_s * shape.num_tokens
                + self.per_pair_s * (shape.attention_pairs - shape.masked_pairs)
                + self.per_pair_s * shape.decode_pairs / 8)

    def predict_many(self, shape):
        return self.predict(shape)  # plain arithmetic: elementwise on a shape of arrays

    def overhead(self, shape, busy) -> float:
        return self.step_overhead_s


class ScriptedRunner:
    """Stands in for a runner: samples the `inner` runner's tokens (or always `token`), takes each step's time
    from `cost` so clocks are exact, and keeps every plan and the logits the inner runner returns."""

    measures_wall_time = False

    def __init__(self, inner=None, cost: StepCost | None = None, token: int = 7):
        self.inner, self.cost, self.token = inner, cost or StepCost(), token
        self.plans = []
        self.logits: dict[int, list] = {}  # request_id → [V] per sampled token

    def execute(self, plan):
        from harness.core.runner import StepResult

        self.plans.append(plan)
        if self.inner is not None:
            result = self.inner.execute(plan)
        else:
            result = StepResult(sampled={c.request.request_id: self.token for c in plan.chunks if c.samples},
                                duration_s=0.0)
        for request_id, row in result.logits.items():
            self.logits.setdefault(request_id, []).append(row)
        shape = step_shape(plan)
        busy = self.cost.predict(shape)
        result.duration_s, result.overhead_s = busy, self.cost.overhead(shape, busy)
        return result


def run_engine(model, specs, strategy: str, block_size: int = 4, num_blocks: int = 256, keep_logits=False,
               max_model_len: int = 2048, kernel_backend: str = "auto", prefix_caching: bool = False,
               scheduler: str = "vllm", **options):
    """The real runner on `model`, with scripted step times: (records, engine, runner with the kept logits)."""
    engine = build_replica(strategy, options,
                           lambda a: ScriptedRunner(RealRunner(model, a, keep_logits, kernel_backend)),
                           num_blocks=num_blocks, block_size=block_size, max_model_len=max_model_len,
                           prefix_caching=prefix_caching, scheduler=scheduler)
    return engine.run(specs), engine, engine.runner


def run_schedule(specs, strategy: str, block_size: int = 4, num_blocks: int = 256, max_model_len: int = 2048,
                 eos_token_ids=(), prefix_caching: bool = False, scheduler: str = "vllm", **options):
    """The schedule alone, no model: (records, runner with every plan, allocator)."""
    engine = build_replica(strategy, options, lambda a: ScriptedRunner(), num_blocks=num_blocks,
                           block_size=block_size, max_model_len=max_model_len, eos_token_ids=eos_token_ids,
                           prefix_caching=prefix_caching, scheduler=scheduler)
    return engine.run(specs), engine.runner, engine.allocator


def assert_same_records(reference: list, simulated: list) -> None:
    """The simulated engines' steps, requests and inter-token gaps are the step-by-step engines', exactly."""
    for ref, sim in zip(reference, simulated, strict=True):
        assert ref.records.steps.frame().equals(sim.records.steps.frame())
        assert [request_outcome(r) for r in ref.records.requests] == [request_outcome(r) for r in sim.records.requests]
        assert sim.allocator.num_used_blocks == 0
    gaps = [metrics.inter_token_latencies([e.records for e in engines]) for engines in (reference, simulated)]
    assert sorted(np.repeat(*gaps[0]).tolist()) == sorted(np.repeat(*gaps[1]).tolist())


def request_outcome(r) -> tuple:
    return (r.request_id, r.status, r.reject_reason, r.sent_s, r.first_scheduled_s, r.first_token_s, r.finish_s,
            r.num_output_tokens, r.num_preemptions, r.num_cached_tokens)


def bare_engine(memory_efficiency: float = 1.0, **figures) -> EngineProfile:
    """An engine profile with no host costs unless given: the roofline's kernels alone."""
    return EngineProfile("test", memory_efficiency, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0).overridden(figures)
