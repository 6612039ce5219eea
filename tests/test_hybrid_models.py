"""Models whose layers mix full attention with linear attention (Gated DeltaNet: Qwen3-Next, Qwen3.5): their weights,
their fixed state per sequence beside a cache only the full layers fill, a step's cost and the cache's capacity; configs
that nest the language model beside a vision encoder or leave their class's defaults out; and the layers this harness's
own runner refuses."""

import dataclasses
import json

import pandas as pd
import pytest

from harness.architecture import Architecture
from harness.config import ConfigError, compose_config, validate
from harness.core.kv_cache import BlockAllocator, BlockCount
from harness.job import run_job
from harness.model_spec import described_model, language_model_config
from harness.sim.costmodel import RooflineCostModel, StepShape
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.costmodel.roofline import LINEAR_STATE_STREAM_SHARE
from harness.sim.engine_profile import get_engine
from strategies import Request
from tests.conftest import bare_engine

H100 = get_hardware("h100")
VLLM = bare_engine(cache_sizing="vllm")  # an engine that sizes its cache as vLLM does
# One sequence's Gated DeltaNet state in Qwen3.5-9B: per linear layer, 32 value heads of a 128 x 128 fp32 matrix and
# the convolution's last 3 inputs over its 2 x 2,048 query-key and 4,096 value channels in bf16; 24 such layers.
QWEN35_9B_STATE = 24 * (32 * 128 * 128 * 4 + (2 * 2048 + 4096) * 3 * 2)


def arch(name: str) -> Architecture:
    return Architecture.from_config(described_model(name), 2)


def decode(num_seqs: int, context: int) -> StepShape:
    keys = num_seqs * context
    return StepShape(False, num_seqs, num_seqs, keys, keys, num_seqs, keys)


def test_a_hybrid_model_caches_its_full_attention_layers_and_keeps_a_fixed_state_for_the_rest():
    qwen35 = arch("qwen3.5-9b")
    assert (qwen35.num_linear_layers, qwen35.num_full_layers) == (24, 8)
    assert qwen35.kv_bytes_per_token == 8 * 2 * 4 * 256 * 2  # 8 layers of 4 KV heads, not 32
    assert qwen35.linear_state_bytes == QWEN35_9B_STATE == 51_511_296
    # Qwen3-Next names no layer types: each fourth layer attends fully, the rest are linear.
    qwen3_next = arch("qwen3-next-80b-a3b")
    assert (qwen3_next.num_linear_layers, qwen3_next.num_full_layers) == (36, 12)
    assert qwen3_next.linear_state_bytes == 36 * (32 * 128 * 128 * 2 + 8192 * 3 * 2)  # its state in bf16


def test_a_hybrid_models_weights_count_its_linear_layers_gates_and_shared_expert():
    qwen3_next = arch("qwen3-next-80b-a3b")
    # The gated attention's query projection is twice as wide; a Gated DeltaNet layer's weights are its own.
    ungated = dataclasses.replace(qwen3_next, attention_output_gate=False)
    assert qwen3_next.attention_params - ungated.attention_params == 2048 * 16 * 256
    assert qwen3_next.linear_attention_params == (2048 * (8192 + 4096 + 64) + 8192 * 4 + 4096 * 2048 + 64)
    # One shared expert of 512 beside the 10 routed ones each token passes through.
    assert qwen3_next.shared_intermediate_size == 512
    no_shared = dataclasses.replace(qwen3_next, num_shared_experts=0, shared_expert_intermediate_size=0)
    assert qwen3_next.num_active_params - no_shared.num_active_params == 48 * 3 * 2048 * 512
    # Qwen's model card: 80B parameters (the catalogue's sizes test holds every model to its card).
    assert qwen3_next.num_params / 1e9 == pytest.approx(80, rel=0.01)


def test_a_config_that_nests_its_language_model_beside_a_vision_encoder_is_read_as_that_model(tmp_path):
    text = described_model("qwen3.5-9b")
    nested = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": text, "vision_config": {"depth": 27, "hidden_size": 1152},
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    read = language_model_config(nested)
    assert read["num_hidden_layers"] == 32 and "vision_config" not in read
    assert read["quantization_config"]["quant_method"] == "fp8"  # what applies to the whole checkpoint stays
    assert Architecture.from_config(read, 2).weight_format_bytes == 1
    # The language model's own config reads as the same model (in BF16: the FP8 was the checkpoint's).
    assert Architecture.from_config(language_model_config(text), 2) == dataclasses.replace(
        Architecture.from_config(read, 2), weight_bytes_per_param=None)
    folder = tmp_path / "qwen3.5-9b-fp8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(nested))
    assert Architecture.from_config(described_model(str(folder)), 2).num_linear_layers == 24


def test_a_config_that_leaves_its_class_defaults_out_is_read_with_them(tmp_path):
    # Gemma 3's config.json names only what differs from Gemma3TextConfig's defaults: no vocabulary, no context, and
    # no word of which layers slide (five in six, 1,024 tokens).
    gemma3 = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                              "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
                              "head_dim": 128, "sliding_window": 1024},
              "vision_config": {"model_type": "siglip_vision_model"}}
    folder = tmp_path / "gemma-3-27b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(gemma3))
    config = described_model(str(folder))
    assert (config["vocab_size"], config["max_position_embeddings"]) == (262208, 131072)
    gemma = Architecture.from_config(config, 2)
    assert (gemma.num_sliding_layers, gemma.num_full_layers, gemma.sliding_window) == (52, 10, 1024)
    assert gemma.num_params / 1e9 == pytest.approx(27.0, rel=0.02) and gemma.tie_word_embeddings


def test_each_sequence_reads_and_writes_its_state_once_a_step_and_attention_runs_in_the_full_layers_only():
    qwen35 = arch("qwen3.5-9b")
    costs = RooflineCostModel(qwen35, H100, bare_engine())
    stateless = RooflineCostModel(dataclasses.replace(qwen35, linear_state_bytes_per_element=0.0, num_linear_layers=0,
                                                      num_layers=8), H100, bare_engine())
    assert costs.attention_flops(decode(64, 4000)) == pytest.approx(stateless.attention_flops(decode(64, 4000)))
    assert costs.kv_bytes(decode(64, 4000)) == stateless.kv_bytes(decode(64, 4000))
    # A decode step of 256 sequences reads and writes 26 GB of state, more than the 16 GB of weights it reads: a state
    # twice as wide (fp32 to a hypothetical 8 bytes) takes that much longer to move.
    assert 256 * 2 * QWEN35_9B_STATE > 1.4 * qwen35.dense_weight_bytes_read()
    recurrent = 24 * 32 * 128 * 128 * 4
    wider = dataclasses.replace(qwen35, linear_state_bytes_per_element=8.0)
    step = decode(256, 500)
    moved_s = 256 * 2 * recurrent / (H100.memory_bandwidth * LINEAR_STATE_STREAM_SHARE)
    assert RooflineCostModel(wider, H100, bare_engine()).predict(step) - costs.predict(step) == pytest.approx(
        moved_s, rel=1e-9)
    # Tensor parallelism splits the state by value head, as it splits the cache.
    split = RooflineCostModel(qwen35, H100, bare_engine(), tensor_parallel=4)
    assert split._state_traffic == costs._state_traffic / 4


@pytest.mark.parametrize("gpus, num_seqs, measured_us", [(4, 32, 13.60), (4, 1024, 215.12), (2, 32, 20.29),
                                                         (2, 1024, 420.22)])
def test_a_linear_layer_moves_its_states_as_fast_as_vllms_decode_kernel_was_timed(gpus, num_seqs, measured_us):
    """vLLM pull request #31722 timed its Gated DeltaNet decode kernel per layer on an H200 with Qwen3-Next's shapes;
    a step's state time per layer here, the convolution's few inputs (5% of the state) beside the kernel's recurrent
    matrices, comes within 5% of each timing."""
    next80 = arch("qwen3-next-80b-a3b")
    costs = RooflineCostModel(next80, get_hardware("h200"), bare_engine(), tensor_parallel=gpus)
    assert costs.state_s(num_seqs) / next80.num_linear_layers == pytest.approx(measured_us * 1e-6, rel=0.05)
    assert RooflineCostModel(arch("qwen3-8b"), H100, bare_engine()).state_s(num_seqs) == 0.0


def test_a_sequences_state_holds_blocks_of_the_cache_as_long_as_it_runs():
    qwen35 = arch("qwen3.5-9b")
    costs = RooflineCostModel(qwen35, H100, bare_engine())
    block = 16 * qwen35.kv_bytes_per_token
    assert costs.state_blocks(16) == -(-QWEN35_9B_STATE // block) == 99
    assert RooflineCostModel(qwen35, H100, bare_engine(), tensor_parallel=2).state_blocks(16) == 99  # split alike
    assert RooflineCostModel(arch("qwen3-8b"), H100, bare_engine()).state_blocks(16) == 0
    # A sequence of 40 tokens in blocks of 16 holds 3 blocks of tokens and its state's.
    for cache in (BlockCount(1000, 16, state_blocks=99), BlockAllocator(1000, 16, state_blocks=99)):
        assert cache.num_blocks_for(40) == 3 + 99
    # Its table holds its tokens' blocks alone (what the real runner's slots read); the state's are kept beside it.
    cache = BlockAllocator(1000, 16, state_blocks=99)
    request = Request(0, 0.0, [0] * 40, 40, 8)
    assert cache.allocate(request, 40) and cache.allocate(request, 49)
    assert len(cache.block_tables[0]) == 4 and cache.num_used_blocks == 4 + 99


def test_vllm_makes_a_hybrid_models_block_as_large_as_one_layers_state():
    # 16 x ceil(state page / (16 x a token's page)): Qwen3.5-9B's 2,146,304-byte layer state over 4,096 bytes a token
    # and layer; Qwen3-Next's 1,097,728 over 2,048, both halved per GPU on two (2 KV heads, 32 value heads split).
    assert RooflineCostModel(arch("qwen3.5-9b"), H100, VLLM).hybrid_block_size(16) == 528
    assert RooflineCostModel(arch("qwen3-next-80b-a3b"), H100, VLLM, tensor_parallel=2
                             ).hybrid_block_size(16) == 544
    assert RooflineCostModel(arch("qwen3-next-80b-a3b"), H100, VLLM, tensor_parallel=4
                             ).hybrid_block_size(16) == 272  # the KV heads replicated past 2 GPUs, the state split
    assert RooflineCostModel(arch("qwen3.5-9b"), H100, VLLM).hybrid_block_size(1024) == 1024
    assert RooflineCostModel(arch("qwen3.5-9b"), H100, get_engine("sglang")).hybrid_block_size(16) == 16  # its own pool
    assert RooflineCostModel(arch("qwen3-8b"), H100, VLLM).hybrid_block_size(16) == 16


def test_a_simulated_hybrid_model_runs_as_many_sequences_as_its_states_leave_room_for(tmp_path):
    base = ["runner=sim", "runner.hardware=h100", "model=qwen3.5-9b", "workload=random", "workload.num_requests=40",
            "workload.input_len=96", "workload.output_len=24", "kv_cache.num_blocks=42", "results.tables=csv",
            "progress=false"]
    summary = run_job(compose_config(base), tmp_path / "run")
    assert summary["num_finished"] == 40 and summary["prefix_caching"] is False  # vLLM's default for these models
    assert (summary["block_size"], summary["num_blocks"]) == (528, 42)
    # Each sequence holds 3 blocks of state (528 tokens' cache of the 8 full layers: 17.3 MB a block, 51.5 MB of
    # state) and one of its 120 tokens: 10 fit in 42 blocks, where without their states all 40 would.
    table = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert table.num_seqs.max() == 10
    assert (table.kv_used_blocks <= 42).all()


@pytest.mark.parametrize("model,layers", [("qwen3.5-9b", "linear-attention layers"),
                                          ("qwen3-next-80b-a3b", "linear-attention layers"),
                                          ("llama-4-scout", "chunked attention layers")])
def test_this_harness_own_runner_refuses_layers_its_paged_attention_cannot_run_in_one_line(model, layers):
    with pytest.raises(ConfigError, match=f"has {layers} .* runner=real cannot run"):
        validate(compose_config(["runner=real", f"model={model}"]))
