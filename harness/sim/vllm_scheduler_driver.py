"""vLLM's own V1 scheduler stepped with no model, run by vLLM's interpreter (`harness.sim.vllm_scheduler` starts it).

Reads a list of bursts from stdin as JSON (each {"prompt_lens", "output_lens", "num_blocks", "block_size",
"max_num_seqs", "max_num_batched_tokens", "prefix_caching", "admission", "eviction"}); for each, adds every request at
once and steps a scheduler of its own until all finish: each step's plan is answered with one sampled token for every
request whose tokens are all computed (as the model runner would), so only scheduling decides what each step holds.
Writes to stdout as JSON, for each burst, one row a step: [prefill tokens, decode tokens, sequences, sequences
preempted]. Imports nothing of this project: vLLM's environment has none of it.
"""

import json
import random
import sys
import tempfile
from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

MAX_MODEL_LEN = 1 << 17  # longer than any request of a published burst (32,000-token prompts): it caps nothing
# A model vLLM can describe without weights or a tokenizer: the scheduler reads only its lengths and cache shape.
TINY_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": MAX_MODEL_LEN, "rms_norm_eps": 1e-6,
               "rope_theta": 1e6, "torch_dtype": "bfloat16", "tie_word_embeddings": True}


def free_in_release_order(pool: BlockPool, ordered_blocks) -> None:
    """`BlockPool.free_blocks` as vLLM had it before PR #42656 (to 0.23): every block no request holds any more goes
    to the free queue's tail, named or not, so blocks are handed out in the order they were freed."""
    blocks = list(ordered_blocks)
    for block in blocks:
        block.ref_cnt -= 1
    pool.free_block_queue.append_n([block for block in blocks if block.ref_cnt == 0 and not block.is_null])


# The order a burst's free blocks go out in (`eviction`): the installed vLLM's own, or the order before PR #42656.
FREE_BLOCKS = {"empty_first": BlockPool.free_blocks, "release_order": free_in_release_order}


def build_scheduler(burst: dict, model_dir: str) -> tuple[Scheduler, object]:
    block_size = burst["block_size"]
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, dtype="bfloat16")
    scheduler_config = SchedulerConfig(max_num_seqs=burst["max_num_seqs"],
                                       max_num_batched_tokens=burst["max_num_batched_tokens"],
                                       max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    # vLLM 0.20 and later admit a prompt only once all of it fits (vllm-project/vllm PR #37307); 0.10-0.19 admitted
    # one whose next chunk fits. The burst says which (`admission`, as the simulator's strategy takes it).
    whole_prompt = burst["admission"] == "whole_prompt"
    if hasattr(scheduler_config, "scheduler_reserve_full_isl"):
        scheduler_config.scheduler_reserve_full_isl = whole_prompt
    elif whole_prompt:
        sys.exit("this vLLM predates whole-prompt admission (scheduler_reserve_full_isl, vLLM 0.20)")
    # Later vLLM hands out blocks holding nothing first (`empty_first`); the engines of the published runs did not.
    BlockPool.free_blocks = FREE_BLOCKS[burst["eviction"]]
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=burst["prefix_caching"])
    num_blocks = burst["num_blocks"] + 1  # vLLM's block pool keeps one as its null block: the same number usable
    cache.num_gpu_blocks = num_blocks
    config = VllmConfig(model_config=model, scheduler_config=scheduler_config, cache_config=cache)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=32, dtype=torch.bfloat16)
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    hasher = None
    if burst["prefix_caching"]:  # as vLLM's engine core sets it up
        from vllm.utils.hashing import get_hash_fn_by_name

        hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(block_size, hash_fn)
    return Scheduler(config, kv_cache, StructuredOutputManager(config), block_size=block_size), hasher


def step_all(scheduler: Scheduler, hasher, burst: dict) -> list[list[int]]:
    rng = random.Random(0)  # distinct prompts: no request finds another's blocks in the prefix cache
    for i, (prompt_len, output_len) in enumerate(zip(burst["prompt_lens"], burst["output_lens"], strict=True)):
        scheduler.add_request(Request(str(i), [rng.randrange(1000) for _ in range(prompt_len)],
                                      SamplingParams(max_tokens=output_len, ignore_eos=True), None,
                                      arrival_time=0.0, block_hasher=hasher))
    rows = []
    while scheduler.has_requests():
        running = {request.request_id for request in scheduler.running}
        plan = scheduler.schedule()
        scheduled = plan.num_scheduled_tokens  # request id -> tokens this step
        if not scheduled:  # a step that only retires finished requests
            scheduler.update_from_output(plan, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
            continue
        ids = list(scheduled)
        requests = [scheduler.requests[i] for i in ids]
        # schedule() has advanced each request's computed tokens: one with all its tokens computed samples the next
        # (a prompt's last chunk, a decode; a preempted request only once it has recomputed its outputs too).
        sampled = [[rng.randrange(1000)] if r.num_computed_tokens >= r.num_tokens else [] for r in requests]
        # A decode: one token of a running request past its prompt (one entering, even with all but its last token
        # found in the prefix cache, is prefilling, as the simulator counts it).
        decode = sum(1 for i, r in zip(ids, requests) if scheduled[i] == 1 and r.num_output_tokens > 0 and i in running)
        preempted = sum(1 for i in running if scheduler.requests[i].status == RequestStatus.PREEMPTED)
        rows.append([sum(scheduled.values()) - decode, decode, len(ids), preempted])
        scheduler.update_from_output(plan, ModelRunnerOutput(req_ids=ids, req_id_to_index={i: k for k, i in
                                                                                           enumerate(ids)},
                                                             sampled_token_ids=sampled))
    return rows


def main() -> None:
    steps = []
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(TINY_CONFIG))
        for burst in json.load(sys.stdin):
            scheduler, hasher = build_scheduler(burst, model_dir)
            steps.append(step_all(scheduler, hasher, burst))
    json.dump(steps, sys.stdout)


if __name__ == "__main__":
    main()
