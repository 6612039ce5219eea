"""The shape read from a model's config against the model transformers builds from the same config on the meta device
(no memory, no weights): every decoder family the simulator models holds the same parameters to within a fraction of a
percent, the layouts it does not model are refused with one line naming what it found, and a model brought from
outside the catalogue whose count strays says so in its run.

Each family is the installed transformers' own default config (its reference checkpoint's shape); a family this
transformers does not have is skipped."""

import json

import pytest
import torch

from harness.architecture import Architecture
from harness.model_spec import language_model_config
from harness.peers.server import word_tokenizer
from harness.sim.replica import misread_layout

# Decoder families, dense and mixtures, with each attention and MLP layout the reader knows: GQA, sliding windows,
# chunked attention, latent attention with and without an indexer, Gated DeltaNet, output gates, attention sinks,
# shared experts of either width, leading dense layers, interleaved and ranged MoE layers, two-matrix MLPs, and Gemma
# 4's full-attention layers of their own head size beside per-layer inputs, and DeepSeek-V4's compressed attention
# with its grouped output and hyper-connections.
MODELED = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text",
           "qwen3_5_moe_text", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "gpt_oss", "gemma2", "gemma3_text",
           "llama4_text", "phi3", "phimoe", "olmo2", "olmoe", "glm4", "glm4_moe", "granite", "granitemoe",
           "ernie4_5_moe", "minimax_m2", "exaone4", "smollm3", "seed_oss", "cohere2", "ministral3", "starcoder2",
           "phi", "gpt_neox", "doge", "gemma4_text", "deepseek_v4"]
# Layouts the cost model has no time for: state-space and convolution hybrids, linear attentions other than Gated
# DeltaNet, a width per layer.
REFUSED = ["mamba2", "jamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2", "minimax", "kimi_linear",
           "gemma3n_text"]


def default_config(model_type: str) -> dict:
    transformers = pytest.importorskip("transformers")
    try:
        config = transformers.AutoConfig.for_model(model_type)
    except ValueError:
        pytest.skip(f"this transformers has no {model_type}")
    return language_model_config(config.to_dict())


def built_params(model_type: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type))
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.parametrize("model_type", MODELED)
def test_each_modeled_family_holds_the_parameters_transformers_builds(model_type):
    config = default_config(model_type)
    read = Architecture.from_config(config, 2).num_params
    assert read == pytest.approx(built_params(model_type), rel=0.005)


@pytest.mark.parametrize("model_type", REFUSED)
def test_a_layout_the_simulator_does_not_model_is_refused_by_name(model_type):
    config = default_config(model_type)
    with pytest.raises(ValueError, match="the simulator does not model") as refused:
        Architecture.from_config(config, 2)
    assert "\n" not in str(refused.value) and repr(config["model_type"]) in str(refused.value)


# Gemma 4's other layouts, as its checkpoints combine them: experts beside the dense MLP with full-attention values
# computed by the key projection (26B-A4B's), trailing layers reading an earlier layer's cache with MLPs twice as wide
# (the small models'), and all of it at once.
GEMMA4_VARIANTS = {
    "experts-and-shared-key-values": dict(enable_moe_block=True, num_experts=128, top_k_experts=8,
                                          moe_intermediate_size=704, attention_k_eq_v=True,
                                          num_global_key_value_heads=2, hidden_size_per_layer_input=0),
    "reused-caches-and-wide-mlps": dict(num_kv_shared_layers=10, use_double_wide_mlp=True),
    "all": dict(enable_moe_block=True, num_experts=16, top_k_experts=4, moe_intermediate_size=512,
                attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=12, use_double_wide_mlp=True),
}


@pytest.mark.parametrize("variant", sorted(GEMMA4_VARIANTS))
def test_gemma4s_layouts_hold_the_parameters_and_cache_transformers_builds(variant):
    transformers = pytest.importorskip("transformers")
    default_config("gemma4_text")  # skips without Gemma 4
    config = transformers.AutoConfig.for_model("gemma4_text", **GEMMA4_VARIANTS[variant])
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    arch = Architecture.from_config(language_model_config(config.to_dict()), 2)
    assert arch.num_params == pytest.approx(sum(p.numel() for p in built.parameters()), rel=0.005)
    # The cache: K and V of each full-attention layer that keeps its own, at that layer's heads.
    owners = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"
              and i < config.num_hidden_layers - config.num_kv_shared_layers]
    heads = config.per_layer_config[owners[0]]
    assert arch.kv_bytes_per_token == len(owners) * 2 * heads.num_key_value_heads * heads.head_dim * 2


def test_a_gemma4_config_file_reads_the_same_without_transformers_gemma4_class():
    """A `config.json` as Gemma 4's checkpoints write it (its full layers' heads as `global_head_dim` and
    `num_global_key_value_heads`), read by a transformers without the model type, is the model its class builds."""
    variant = GEMMA4_VARIANTS["experts-and-shared-key-values"]
    raw = {"model_type": "gemma4_text", "global_head_dim": 512, **variant} | {
        key: value for key, value in default_config("gemma4_text").items()
        if key not in ("per_layer_config", "model_type", *variant)}
    through_class = language_model_config(raw)
    assert "per_layer_config" in through_class
    assert Architecture.from_config(raw, 2) == Architecture.from_config(through_class, 2)


def test_gemma4s_per_layer_inputs_are_looked_up_not_streamed():
    gemma4 = Architecture.from_config(default_config("gemma4_text"), 2)
    table = gemma4.per_layer_input_table_params
    assert table == 262144 * 30 * 256  # vocabulary x layers x width: two of the model's five billion parameters
    assert gemma4.weight_bytes - gemma4.dense_weight_bytes_read() >= 2 * table  # held, never read whole a step


def test_a_config_without_a_decoders_fields_is_refused_by_name():
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    with pytest.raises(ValueError, match="gives no num_hidden_layers, hidden_size, num_attention_heads, "
                                         "intermediate_size"):
        Architecture.from_config(gpt2, 2)


def test_a_model_whose_count_strays_from_transformers_says_by_how_much():
    llama = default_config("llama")
    assert misread_layout(llama, Architecture.from_config(llama, 2)) is None
    # A layout part the reader would not see: the same model read as if its MLP were a third wider.
    wider = Architecture.from_config(llama | {"intermediate_size": llama["intermediate_size"] * 4 // 3}, 2)
    warning = misread_layout(llama, wider)
    assert "'llama'" in warning and "6.74B" in warning and "+" in warning and "off by as much" in warning
    assert misread_layout({"model_type": "not-a-model", "hidden_size": 8}, wider) is None  # nothing to build


def test_a_run_of_a_model_folder_warns_when_its_layout_is_misread_and_its_summary_and_report_say_so(tmp_path, caplog):
    from harness.config import compose_config
    from harness.job import run_job

    # Llama 4's name for its dense layers' MLP width, in a Llama config: the reader takes it, Llama's code does not.
    config = default_config("llama") | {"intermediate_size_mlp": 2 * 11008}
    (tmp_path / "config.json").write_text(json.dumps(config))
    word_tokenizer(config["vocab_size"]).save_pretrained(tmp_path)
    run = ["runner=sim", "runner.hardware=h100", "workload=random", "workload.input_len=64", "workload.output_len=8",
           "workload.num_requests=4", "progress=false"]
    with caplog.at_level("WARNING"):
        summary = run_job(compose_config([*run, "model=hf", f"model.name={tmp_path}"]), tmp_path / "misread")
    warnings = [record.message for record in caplog.records if "transformers builds" in record.message]
    assert len(warnings) == 1 and "'llama'" in warnings[0] and "6.74B (+" in warnings[0]
    # A sweep's runs keep it: the summary and the report say it, and a catalogue model's run says nothing.
    written = json.loads((tmp_path / "misread" / "summary.json").read_text())
    assert written["layout_warning"] == summary["layout_warning"] == warnings[0]
    assert warnings[0] in (tmp_path / "misread" / "report.md").read_text()
    described = run_job(compose_config([*run, "model=llama-2-7b"]), tmp_path / "described")
    assert described["layout_warning"] is None


def test_this_harness_own_runner_refuses_gemma4s_layers_in_one_line(tmp_path):
    from harness.config import ConfigError, compose_config, validate

    (tmp_path / "config.json").write_text(json.dumps(default_config("gemma4_text")))
    with pytest.raises(ConfigError, match=r"per-layer inputs \(Gemma 4\), which runner=real cannot run"):
        validate(compose_config(["runner=real", "model=hf", f"model.name={tmp_path}"]))


def test_deepseek_sparse_attention_reads_and_computes_only_the_keys_its_indexer_picks():
    from harness.model_spec import described_model
    from harness.sim.costmodel import RooflineCostModel, StepShape
    from harness.sim.costmodel.hardware import get_hardware
    from tests.conftest import bare_engine

    dense, sparse = (Architecture.from_config(described_model(name), 2) for name in ("deepseek-v3", "deepseek-v3.2"))
    assert (sparse.num_indexed_layers, sparse.index_topk, sparse.index_key_bytes) == (61, 2048, 132)
    # The cache keeps every token's latent and, in each layer, its FP8 index key and scale.
    assert sparse.kv_bytes_per_token == dense.kv_bytes_per_token + 61 * 132
    h200 = get_hardware("h200")
    costs = {arch: RooflineCostModel(arch, h200, bare_engine(), tensor_parallel=8) for arch in (dense, sparse)}

    def decode(rows, context):
        return StepShape(False, rows, rows, rows * context, rows * context, rows, decode_pairs=rows * context)

    # Within the indexer's pick, a decode step reads what V3 reads and the index keys besides.
    short = decode(64, 1024)
    assert costs[sparse].kv_bytes(short) == pytest.approx(costs[dense].kv_bytes(short) + 61 * 132 * 64 * 1025)
    assert costs[sparse].attention_flops(short) > costs[dense].attention_flops(short)
    # At 32,000 tokens each query reads 2,048 latents and every index key: a fraction of V3's bytes and step.
    long = decode(64, 32000)
    assert costs[sparse].kv_bytes(long) < 0.3 * costs[dense].kv_bytes(long)
    assert costs[sparse].predict(long) < 0.7 * costs[dense].predict(long)
    # A 32,000-token prompt: attention over 2,048 keys a query where V3's grows with the prompt, the indexer's
    # scores over every pair in FP8 beside it.
    prompt = StepShape(False, 32000, 1, 32000 * 32001 // 2, 0, 1, masked_pairs=0)
    assert costs[sparse].attention_flops(prompt) < 0.3 * costs[dense].attention_flops(prompt)


def test_deepseek_v4_keeps_and_computes_what_its_card_says_against_v32_at_a_million_tokens():
    """DeepSeek-V4-Flash's card: at 1M tokens of context, 7% of DeepSeek-V3.2's KV cache and 10% of its FLOPs per
    generated token (as quoted in learnaivisually.com/ai-explained/deepseek-v4-long-context-cost). Here 7.6% and 12%:
    its window, its CSA entries (one per 4 tokens, 512 picked) and index keys, its HCA entries (one per 128)."""
    from harness.model_spec import described_model
    from harness.sim.costmodel import RooflineCostModel, StepShape
    from harness.sim.costmodel.hardware import get_hardware
    from tests.conftest import bare_engine

    v4, v32 = (Architecture.from_config(described_model(name), 2) for name in ("deepseek-v4-flash", "deepseek-v3.2"))
    assert (v4.num_csa_layers, v4.num_hca_layers, v4.num_sliding_layers, v4.kv_width) == (20, 23, 43, 512)
    # Per token: a CSA layer's 512-wide entry and 132-byte index key every 4 tokens, an HCA layer's every 128.
    assert v4.kv_bytes_per_token == 20 * (512 * 2 + 132) / 4 + 23 * 512 * 2 / 128
    assert v4.kv_bytes_per_token / v32.kv_bytes_per_token == pytest.approx(0.07, abs=0.01)
    # One generated token at 1M tokens of context, on a GPU without FP8 tensor cores (its FLOPs as they are).
    row = StepShape(False, 1, 1, 10**6, 10**6, 1, decode_pairs=10**6)
    flops = {}
    for arch in (v4, v32):
        costs = RooflineCostModel(arch, get_hardware("a100-80gb"), bare_engine())
        flops[arch] = sum(costs.gemm_flops(row)) + costs.attention_flops(row)
    assert flops[v4] / flops[v32] == pytest.approx(0.10, abs=0.03)
