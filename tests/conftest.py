"""Shared fixtures: the default tiny model (runner copy and reference copy) and an engine-run helper."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness.engine import Engine
from harness.kv_cache import BlockAllocator
from harness.model import build_random_model, model_config
from harness.runners import StepResult
from harness.runners.real import RealRunner
from strategies import STRATEGIES
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


def run_engine(model, specs, strategy: str, block_size: int = 4, num_blocks: int = 256, keep_logits=False,
               max_model_len: int = 2048, kernel_backend: str = "auto", **options):
    allocator = BlockAllocator(num_blocks, block_size)
    runner = RealRunner(model, allocator, keep_logits, kernel_backend)
    engine = Engine(STRATEGIES[strategy](allocator, **options), runner,
                    allocator, max_model_len=max_model_len)
    return engine.run(specs), engine, allocator


class FixedStepRunner:
    """A stand-in for the runner in scheduler tests: every step takes `step_s` and samples token 7."""

    measures_wall_time = False

    def __init__(self, step_s: float = 0.01):
        self.step_s = step_s
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return StepResult(sampled={c.request.request_id: 7 for c in plan.chunks if c.samples}, duration_s=self.step_s)


def run_schedule(specs, strategy: str, block_size: int = 4, num_blocks: int = 256, max_model_len: int = 2048,
                 **options):
    """Run the engine with `FixedStepRunner`: the schedule alone, no model."""
    allocator = BlockAllocator(num_blocks, block_size)
    runner = FixedStepRunner()
    engine = Engine(STRATEGIES[strategy](allocator, **options), runner, allocator, max_model_len=max_model_len)
    return engine.run(specs), runner, allocator
