"""The simulator's `vllm` scheduler beside vLLM's own V1 scheduler (`harness.sim.vllm_scheduler`): a burst scheduled
by both, step for step. Skips where vLLM is not installed (bash scripts/install-vllm.sh)."""

import numpy as np
import pandas as pd
import pytest

from harness.config import server_python
from harness.sim import vllm_scheduler
from harness.sim.measured import load_measured_runs
from harness.sim.vllm_scheduler import COLUMNS, burst_of, first_difference, simulator_steps, step_summary, vllm_steps
from tests.conftest import ROOT

needs_vllm = pytest.mark.skipif(not server_python(".venv-vllm").is_file(),
                                reason="vLLM is not installed (bash scripts/install-vllm.sh)")
PUBLISHED = ROOT / "tests/fixtures/published/gpustack"


def burst(num_blocks: int, prefix_caching: bool, admission: str, eviction: str = "release_order") -> dict:
    """40 requests of 16-300 prompt and 1-60 output tokens under 8 sequences and 128 tokens a step: chunked
    prefills beside decodes, requests finishing and replaced, and with few blocks, preemptions."""
    rng = np.random.default_rng(1)
    return {"prompt_lens": rng.integers(16, 300, 40).tolist(), "output_lens": rng.integers(1, 60, 40).tolist(),
            "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 128, "num_blocks": num_blocks,
            "prefix_caching": prefix_caching, "admission": admission, "eviction": eviction}


# Each case: the cache's blocks, prefix caching, admission, eviction, and the preemptions the schedule makes.
CASES = {"cache-holds-all": (400, False, "next_chunk", "release_order", (0, 0)),
         "preempting-with-prefix-cache": (60, True, "next_chunk", "release_order", (20, 30)),
         "evicting-in-release-order": (25, True, "next_chunk", "release_order", (25, 35)),
         "evicting-empty-first": (25, True, "next_chunk", "empty_first", (25, 35)),
         "preempted-mid-recompute": (40, False, "next_chunk", "release_order", (40, 50)),
         "whole-prompt-admission": (25, True, "whole_prompt", "release_order", (1, 10))}


@pytest.fixture(scope="module")
def vllm_schedules() -> dict[str, pd.DataFrame]:
    """vLLM's steps for every case, from one process (its import is most of the time)."""
    return dict(zip(CASES, vllm_steps([burst(*case[:4]) for case in CASES.values()]), strict=True))


@needs_vllm
@pytest.mark.parametrize("case", CASES)
def test_the_simulator_schedules_a_burst_step_for_step_as_vllm_does(case, vllm_schedules):
    *work, preemptions = CASES[case]
    ours, theirs = simulator_steps(burst(*work)), vllm_schedules[case]
    summary = step_summary(ours)
    assert summary["mixed"] > 20  # chunked prefills beside decodes, the steps whose make-up matters
    # The case it names: none preempted while the cache holds every request, many in a small one, a few once a
    # prompt waits for room for all of it.
    assert preemptions[0] <= summary["preemptions"] <= preemptions[1]
    # Every step: prefill tokens, decode tokens, sequences, sequences preempted.
    assert ours.values.tolist() == theirs.values.tolist()


@pytest.mark.parametrize("fixture, refusal", [("gpustack-h100-qwen3-8b-vllm-bs4", "only a burst"),
                                              ("gpustack-h100-qwen3-14b-sglang-sharegpt-1000", "does not schedule as")])
def test_only_a_vllm_burst_is_compared_step_for_step(fixture, refusal):
    # A closed loop's sends wait on finishes, which wait on step times; SGLang's scheduler is not vLLM's.
    with pytest.raises(ValueError, match=refusal):
        burst_of(load_measured_runs([str(PUBLISHED / f"{fixture}.json")])[0])


def test_the_first_step_two_schedules_part_at_is_found():
    steps = pd.DataFrame([[128, 0, 1, 0], [120, 8, 9, 0], [0, 9, 9, 0]], columns=COLUMNS)
    assert first_difference(steps, steps.copy()) is None
    other = steps.copy()
    other.iloc[1, 3] = 1  # the same tokens, but a preemption
    assert first_difference(steps, other) == 1
    assert first_difference(steps, steps.iloc[:2]) == 2  # one ran a step the other did not


def test_the_command_checks_every_burst_then_steps_them_all_in_one_vllm_process(monkeypatch, capsys):
    # vLLM's side stood in for by the simulator's own steps: what is tested is how the command hands bursts over.
    handed = []

    def steps_of(bursts, server_env):
        handed.append([len(burst["prompt_lens"]) for burst in bursts])
        return [simulator_steps(burst) for burst in bursts]

    monkeypatch.setattr(vllm_scheduler, "vllm_steps", steps_of)
    runs = [str(PUBLISHED / f"gpustack-h100-qwen3-{size}-vllm-random-32k.json") for size in ("14b", "32b")]
    vllm_scheduler.main(runs)
    printed = capsys.readouterr().out
    assert handed == [[100, 100]] and printed.count("identical step for step") == 2
    assert "gpustack-h100-qwen3-32b-vllm-random-32k" in printed
    # A run that is no burst is refused with one line before vLLM is started for any of them.
    with pytest.raises(SystemExit, match="vllm_scheduler: gpustack-h100-qwen3-8b-vllm-bs4: only a burst"):
        vllm_scheduler.main([runs[0], str(PUBLISHED / "gpustack-h100-qwen3-8b-vllm-bs4.json")])
    assert len(handed) == 1
