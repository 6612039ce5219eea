"""The hardware and model catalogues, and the published runs the simulator's defaults are grounded in."""

import json

import pytest
import yaml

from harness.architecture import Architecture
from harness.config import compose_config, validate
from harness.model_spec import described_model
from harness.sim.calibrate import default_params, relative_errors, simulate
from harness.sim.costmodel import RooflineCostModel, build_cost_model
from harness.sim.costmodel.hardware import CATALOGUE_DIR, DEFAULT_COMPUTE_EFFICIENCY, catalogue, get_hardware
from harness.sim.measured import MeasuredRunError, load_measured
from tests.conftest import ROOT, bare_engine

PUBLISHED = sorted((ROOT / "tests" / "fixtures" / "published").glob("*.json"))
# Parameter counts the model cards publish (billions): a wrong number in a config shows here.
PARAMETERS_B = {
    "llama-3.1-8b": 8.03,
    "llama-3.1-70b": 70.55,
    "llama-3-8b": 8.03,
    "llama-3-70b": 70.55,
    "llama-2-7b": 6.74,
    "llama-2-13b": 13.02,
    "mistral-7b": 7.25,
    "qwen2.5-7b": 7.62,
    "qwen2.5-72b": 72.7,
    "qwen3-0.6b": 0.60,
    "qwen2.5-0.5b": 0.49,
    "llama-3.2-1b": 1.24,
    "mixtral-8x7b": 46.7,
    # 2026's models, each against its model card: Meta's, Qwen's (the Qwen3 technical report, arXiv 2505.09388),
    # OpenAI's gpt-oss card (arXiv 2508.10925: 116.83B and 20.91B) and DeepSeek-V3's (671B without its MTP module).
    "llama-3.3-70b": 70.6,
    "qwen3-8b": 8.2,
    "qwen3-14b": 14.8,
    "qwen3-32b": 32.8,
    "qwen3-30b-a3b": 30.5,
    "qwen3-235b-a22b": 235.0,
    "gpt-oss-20b": 20.91,
    "gpt-oss-120b": 116.83,
    "deepseek-v3": 671.0,
    "deepseek-v3.2": 671.0,  # its card's 685B less the multi-token-prediction module, as V3's
    "deepseek-v4-flash": 284.0,
    # Linear attention mixed with full (Gated DeltaNet): Qwen3-Next's card (80B), and Qwen3.5-9B's language model,
    # its checkpoint's 9.65B (19,306,216,416 bytes in BF16) less its vision encoder and multi-token-prediction layer.
    "qwen3-next-80b-a3b": 80.0,
    "qwen3.5-9b": 8.95,
    "qwen3.5-35b-a3b": 35.0,  # its card's name; THUDM/slime's shape of it, as conf/model/ cites
    # Llama 4's cards (Meta's): Scout 109B, Maverick 400B, each 17B active.
    "llama-4-scout": 109.0,
    "llama-4-maverick": 400.0,
}
# Parameters activated per token, as the cards give them. They round, and they differ on whether the input
# embedding (a lookup, not a multiply) counts: gpt-oss's card leaves it out (5.13B), Qwen's and DeepSeek's do not say.
ACTIVE_B = {"mixtral-8x7b": 12.9, "qwen3-30b-a3b": 3.3, "qwen3-235b-a22b": 22.0, "gpt-oss-20b": 3.61,
            "gpt-oss-120b": 5.13, "deepseek-v3": 37.0, "llama-4-scout": 17.0, "llama-4-maverick": 17.0,
            "qwen3.5-35b-a3b": 3.0, "deepseek-v3.2": 37.0, "deepseek-v4-flash": 13.0}


@pytest.mark.parametrize("name", catalogue())
def test_every_hardware_file_has_every_figure_and_cites_its_source(name):
    hardware = get_hardware(name)
    assert hardware.peak_flops > 1e13 and hardware.memory_bandwidth > 1e11 and hardware.memory_bytes > 1e10
    assert hardware.interconnect_bandwidth > 0
    assert "Source:" in (CATALOGUE_DIR / f"{name}.yaml").read_text()


def test_the_catalogue_has_the_gpus_users_rent():
    assert {"a100-40gb", "a100-80gb", "h100", "h100-pcie", "h200", "b200", "l4", "l40s", "rtx-4090", "mi300x"} <= set(
        catalogue()
    )


def test_a_gpu_comes_from_a_file_or_inline_and_an_incomplete_one_is_named(tmp_path):
    figures = {
        "name": "my-gpu",
        "bf16_tflops": 400,
        "memory_bandwidth_gbps": 2000,
        "memory_gb": 64,
        "interconnect_gbps": 400,
    }
    path = tmp_path / "my_gpu.yaml"
    path.write_text(yaml.safe_dump(figures))
    assert get_hardware(str(path)) == get_hardware(figures)
    assert get_hardware(figures).memory_bandwidth == 2000e9
    del figures["memory_gb"]
    path.write_text(yaml.safe_dump(figures))
    with pytest.raises(ValueError, match=r"hardware file '.*my_gpu.yaml': memory_gb is required"):
        get_hardware(str(path))
    with pytest.raises(ValueError, match="unknown hardware 'tpu-v9'; the catalogue has a100-40gb, a100-80gb"):
        get_hardware("tpu-v9")
    figures |= {"memory_gb": 64, "fp8_block_scaled_share": 0.75}
    with pytest.raises(ValueError, match="fp8_block_scaled_share is a share of fp8_tflops, which is not given"):
        get_hardware(figures)
    assert get_hardware(figures | {"fp8_tflops": 800}).gemm_peak(1) == 600e12
    with pytest.raises(ValueError, match=r"stream_bandwidth_gbps \(2100\) is above the datasheet's "
                                         r"memory_bandwidth_gbps \(2000\)"):
        get_hardware(figures | {"fp8_tflops": 800, "stream_bandwidth_gbps": 2100})


def test_an_inline_gpu_works_from_the_command_line():
    cfg = validate(
        compose_config(
            [
                "runner=sim",
                "model=llama-3.1-8b",
                "runner.hardware={name: my-gpu, bf16_tflops: "
                "400, memory_bandwidth_gbps: 2000, memory_gb: 64, interconnect_gbps: 400}",
            ]
        )
    )
    assert cfg.runner.hardware["memory_gb"] == 64


def test_a_gpu_class_figure_sets_the_compute_efficiency_unless_the_run_gives_one():
    arch = Architecture.from_config(described_model("llama-3.1-8b"), 2)
    a100, h100 = get_hardware("a100-80gb"), get_hardware("h100")
    engine = bare_engine()
    assert RooflineCostModel(arch, a100, engine).compute_efficiency == a100.compute_efficiency
    assert a100.compute_efficiency > DEFAULT_COMPUTE_EFFICIENCY
    assert RooflineCostModel(arch, h100, engine).compute_efficiency == DEFAULT_COMPUTE_EFFICIENCY
    assert RooflineCostModel(arch, a100, engine, compute_efficiency=0.6).compute_efficiency == 0.6
    chosen = build_cost_model(
        validate(compose_config(["runner=sim", "runner.hardware=a100-80gb", "runner.compute_efficiency=0.6"])).runner,
        arch,
    )
    assert chosen.compute_efficiency == 0.6


@pytest.mark.parametrize("name,billions", PARAMETERS_B.items())
def test_every_described_model_has_its_published_size(name, billions):
    arch = Architecture.from_config(described_model(name), 2)
    total = arch.num_params
    assert total / 1e9 == pytest.approx(billions, rel=0.015)


@pytest.mark.parametrize("name,billions", ACTIVE_B.items())
def test_every_mixture_activates_what_its_card_says(name, billions):
    active = Architecture.from_config(described_model(name), 2).num_active_params
    assert active / 1e9 == pytest.approx(billions, rel=0.1)


def test_an_unknown_model_lists_the_catalogue():
    with pytest.raises(ValueError, match=r"unknown model 'llama-9b': give a model of the catalogue \(conf/model/: "
                                         r"deepseek-v3, deepseek-v3.2, deepseek-v4-flash, gpt-oss-120b, .*\) or a "
                                         r"folder holding the model's config.json"):
        described_model("llama-9b")
    with pytest.raises(ValueError, match="unknown model 'hf'"):  # the hub model's entry describes no model
        described_model("hf")


def test_a_model_folder_describes_its_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(described_model("llama-3.1-8b")))
    folder, entry = described_model(str(tmp_path)), described_model("llama-3.1-8b")
    assert Architecture.from_config(folder, 2) == Architecture.from_config(entry, 2)
    assert folder["max_position_embeddings"] == entry["max_position_embeddings"]  # read with its class's other fields


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "fixtures" / "published").rglob("*.json")),
                         ids=lambda p: p.stem)
def test_published_runs_are_whole(path):
    """Each fixture names its source, GPU and model, and its per-request lengths add up to its own totals."""
    data = json.loads(path.read_text())
    assert data["source"].startswith("https://") and data["hardware"] in catalogue()
    described_model(data["model"])
    if "input_lens" in data:
        assert sum(data["input_lens"]) == data["total_input_tokens"]
        assert sum(data["output_lens"]) == data["total_output_tokens"]
        assert len(data["input_lens"]) == data["num_prompts"]


# The README's table of the 2024 defaults against the first published runs, which the `vllm-0.5` profile keeps: its
# errors, as printed (throughput, TPOT p50, TTFT p50; the H200 batch: throughput and mean E2E).
TABLE_2024 = {
    "kvcached-h100-qwen3-0.6b-rate-16": (0.000, 0.013, 0.053),
    "lambda-a100-mistral-7b-320": (0.060, -0.060, -0.036),
    "lambda-h100-llama-3-8b-320": (-0.005, -0.009, -0.107),
    "lambda-h100-llama-3-8b-10": (-0.073, 0.036, -0.033),
    "lambda-h100-mistral-7b-10": (-0.080, 0.062, -0.093),
    "lambda-h100-mistral-7b-320": (-0.046, 0.029, -0.031),
    "vllm-ci-h200-llama-3.1-8b-latency": (0.097, -0.088),
}


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_the_2024_profile_reproduces_its_published_table_exactly(path):
    """`runner.engine=vllm-0.5` gives the errors the 2024 defaults gave, to the printed 0.1%: throughput, TPOT p50 and
    end-to-end latency within 15%, TTFT p50 within 25%, of what was measured."""
    run = load_measured(path)
    run.setup["engine_profile"] = "vllm-0.5"
    run.setup.pop("async_scheduling", None)  # the 2024 fit knew no async scheduling
    errors = relative_errors(run, simulate(run, default_params(run)))
    keys = ["output_throughput_tps", *(["e2e_s_mean"] if "e2e_s_mean" in errors else ["tpot_s_p50", "ttft_s_p50"])]
    assert [round(errors[key], 3) for key in keys] == pytest.approx(TABLE_2024[path.stem], abs=1e-9)
    for key, error in errors.items():
        assert abs(error) <= (0.25 if key == "ttft_s_p50" else 0.15), (key, f"{error:+.1%}")


def test_a_measured_run_without_its_lengths_or_its_gpu_is_refused(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps({"num_prompts": 10, "output_throughput": 100.0, "hardware": "h100", "model": "llama-3.1-8b"})
    )
    with pytest.raises(
        MeasuredRunError, match="does not say its requests' lengths: save it with vllm bench --save-detailed"
    ):
        load_measured(path)
    path.write_text(json.dumps({"num_prompts": 10, "output_throughput": 100.0}))
    with pytest.raises(MeasuredRunError, match="say which GPU and model it ran on"):
        load_measured(path)
