"""What `auto` means for a real run's KV cache: the largest step a strategy runs on a workload, which a GPU run
measures before it sizes its cache (that measuring itself runs in the GPU check), and the CPU's fixed pool."""

import torch

from harness.config import compose_config, validate
from harness.run_parts import CPU_NUM_BLOCKS, device_num_blocks, largest_step
from workloads import RequestSpec, Workload

CAPS = (1024, 8192)  # vLLM's engine caps on a large GPU: sequences, batched tokens


def workload(*prompt_lens: int) -> Workload:
    return Workload("lengths", [RequestSpec(i, 0.0, (), 8, prompt_len=n) for i, n in enumerate(prompt_lens)])


def run_config(*overrides: str):
    return validate(compose_config(list(overrides)))


def test_the_largest_step_is_a_ragged_one_filling_the_token_budget_where_that_is_the_larger():
    for strategy in ("continuous", "static", "dynamic"):
        assert largest_step(run_config(f"strategy={strategy}"), workload(10, 20), CAPS, 131072) == (1, 8192, False)
    configured = run_config("strategy=continuous", "strategy.max_batch_tokens=512")
    assert largest_step(configured, workload(10), CAPS, 131072) == (1, 512, False)
    assert largest_step(configured, workload(10), CAPS, 256) == (1, 256, False)  # no step is longer than the context


def test_the_largest_step_is_a_padded_batch_as_wide_as_the_longest_prompt_where_that_is_the_larger():
    lengths = workload(*[100] * 40, 700, 5000)
    for strategy in ("static", "dynamic", "continuous"):
        # concurrency auto: the engine's 1024 sequences, so a batch takes all 42 requests (29,400 tokens > 8,192);
        # the 5000-token prompt is rejected with a 4096-token context, so the widest row is 700 tokens
        assert largest_step(run_config(f"strategy={strategy}"), lengths, CAPS, 4096) == (42, 700, True)
        assert largest_step(run_config(f"strategy={strategy}"), lengths, CAPS, 8192) == (42, 5000, True)
        # eight rows of 700 are 5,600 tokens: the token budget's step is the larger
        shorter = workload(*[100] * 40, 700)
        assert largest_step(run_config(f"strategy={strategy}", "concurrency=8"), shorter, CAPS, 8192) == (1, 8192,
                                                                                                           False)
    assert largest_step(run_config("strategy=static", "concurrency=16"), lengths, CAPS, 4096) == (16, 700, True)


def test_a_cpu_run_gets_the_fixed_pool_and_a_configured_cache_its_size():
    cpu = torch.device("cpu")
    step = (1, 512, False)
    assert device_num_blocks(run_config(), None, cpu, step) == CPU_NUM_BLOCKS
    assert device_num_blocks(run_config("kv_cache.num_blocks=77"), None, cpu, step) == 77
