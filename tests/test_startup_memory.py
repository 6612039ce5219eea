"""How each engine sizes its KV cache at start-up (`harness.sim.costmodel.startup_memory`), against what the engines'
code and GPUStack's published runs of Qwen3-32B on one 80 GB GPU show."""

import numpy as np
import pytest

import harness.sim.calibrate as calibrate
from harness.analysis import metrics
from harness.config import compose_config, validate
from harness.sim.calibrate import default_params, run_architecture, simulate
from harness.sim.costmodel import RooflineCostModel
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.costmodel.startup_memory import NON_TORCH_BYTES, profile_run_bytes, sglang_mem_fraction_static
from harness.sim.engine_profile import get_engine
from harness.sim.measured import load_measured
from harness.sim.replica import simulated_replicas
from tests.conftest import ROOT

GPUSTACK = ROOT / "tests" / "fixtures" / "published" / "gpustack"


def cache_tokens(engine: str, hardware: str, memory_fraction=None) -> int:
    """Tokens Qwen3-32B's cache holds on one GPU of `hardware` under `engine`, at vLLM's default caps there."""
    run = load_measured(GPUSTACK / "gpustack-h100-qwen3-32b-vllm-random-4k.json")
    costs = RooflineCostModel(run_architecture(run), get_hardware(hardware), get_engine(engine))
    return 16 * costs.num_kv_blocks(16, memory_fraction, get_hardware(hardware).serving_defaults)


def test_sglang_takes_its_own_default_share_of_the_gpu():
    """SGLang's --mem-fraction-static: (memory - reserved) / memory, 13,440 MiB reserved on an 80 GB GPU at one GPU
    (512 + 1.5 x 8,192 + 2 x 256 + 128); a user found 0.828 for Qwen3-32B on an H100 (sgl-project/sglang #29092)."""
    h100 = get_hardware("h100").memory_bytes
    assert sglang_mem_fraction_static(h100) == round(1 - 13440 / (h100 / 2**20), 3)
    assert sglang_mem_fraction_static(h100) == pytest.approx(0.828, abs=0.01)
    assert sglang_mem_fraction_static(h100, 8) < sglang_mem_fraction_static(h100)  # more graphs, communicators
    assert sglang_mem_fraction_static(get_hardware("h200").memory_bytes, 8) > 0.89  # 10 GiB of 141 GB
    # A 24 GB GPU: a 2,048-token chunk and graphs of 24 (512 + 3,072 + 48 + 128 MiB), no 10 GiB floor.
    assert sglang_mem_fraction_static(24e9) == round(1 - 3760 / (24e9 / 2**20), 3)


def test_vllm_holds_back_its_profile_runs_peak_as_gpustacks_qwen3_32b_runs_show():
    """On one H100 GPUStack's vLLM served 32,100-token requests of Qwen3-32B at --max-model-len 32768, so its cache held
    at least 32,768 tokens (vLLM starts no smaller one), and fewer than the 40,960 of the model's context (it would have
    started there, and its A100 twin needed the flag); its 4,000-token burst peaked at 186 output tokens a second at
    43 ms a step: 8 requests decoding at once (each its prompt and first token when it starts to), where the memory
    share less the weights alone holds 10."""
    held = cache_tokens("vllm-v1", "h100")
    assert 32_768 <= held < 40_960
    decoding = 4000 + 1
    assert held // decoding == 8 and cache_tokens("sglang", "h100", memory_fraction=0.9) // decoding == 10
    # At an H100's caps the sampler's moment is the larger: 1,024 rows of 151,936 logits in bf16 and three fp32 copies
    # (the fp32 logits, FlashInfer's top-k mask of them and its softmax), over 8,192 tokens of the residual stream,
    # its normed copy and a 25,600-wide MLP's gate, up and activation in bf16; an A100's caps (256 rows, 2,048
    # tokens) hold a third as much.
    arch = run_architecture(load_measured(GPUSTACK / "gpustack-h100-qwen3-32b-vllm-random-4k.json"))
    forward, sampler = 8192 * (2 * 5120 + 3 * 25600) * 2, 1024 * 151_936 * (2 + 3 * 4)
    assert profile_run_bytes(arch, 8192, 1024) == pytest.approx(NON_TORCH_BYTES + sampler)
    assert sampler > forward
    assert profile_run_bytes(arch, 2048, 256) < profile_run_bytes(arch, 8192, 1024) / 3
    assert cache_tokens("vllm-v1", "a100-80gb") > held
    # vLLM 0.12-0.16's sorting sampler would have left too little for 32,768 tokens: its sort's values and int64
    # indices alone, beside the logits counted here.
    sort = 1024 * 151_936 * (4 + 8)
    assert held - sort // (arch.kv_bytes_per_token * 16) * 16 < 32_768


def test_a_simulated_burst_peaks_where_gpustacks_published_runs_did(monkeypatch):
    """vllm bench serve's peak output rate (the most tokens in one second) is the decoding concurrency at the
    decode step's pace: the simulator's replay of GPUStack's Qwen3-32B bursts on one H100, whose cache decides how
    many decode at once, reaches the published peak within 10% (186 tokens a second on 4,000-token prompts, 359 on
    2,000) with the cache vLLM sizes; with the share less the weights alone, 20% above it."""
    engines = []
    build = calibrate.build_replica
    monkeypatch.setattr(calibrate, "build_replica", lambda *a, **k: engines.append(build(*a, **k)) or engines[-1])

    def peak(name: str) -> float:
        run = load_measured(GPUSTACK / f"{name}.json")
        simulate(run, default_params(run))
        steps = metrics.steps_table(engines[-1].records, engines[-1].allocator.num_blocks)
        seconds = np.floor(steps.start_s + steps.duration_s).astype(int)
        return np.bincount(seconds, weights=steps.num_decode_tokens).max()

    assert peak("gpustack-h100-qwen3-32b-vllm-random-4k") == pytest.approx(186, rel=0.1)
    assert peak("gpustack-h100-qwen3-32b-vllm-random-2k") == pytest.approx(359, rel=0.1)
    share_alone = get_engine("vllm-v1").overridden({"cache_sizing": "share"})
    monkeypatch.setattr(calibrate, "_profile", lambda name: share_alone)
    assert peak("gpustack-h100-qwen3-32b-vllm-random-4k") > 1.2 * 186


def test_a_simulation_sizes_the_cache_as_its_engine_profile_does():
    """`kv_cache.memory_fraction=auto` takes the engine's default share (vLLM's 0.9 less its profile run, SGLang's
    own); a share given is the engine's flag's (--gpu-memory-utilization, --mem-fraction-static). Every strategy
    gets the same cache, whatever its own caps: the profile run is the engine's at its default caps."""
    def blocks(*overrides: str) -> int:
        cfg = validate(compose_config(["runner=sim", "runner.hardware=h100", "model=qwen3-32b",
                                       "workload.num_requests=4", *overrides]))
        replicas, *_ = simulated_replicas(cfg)
        return replicas[0].allocator.num_blocks

    vllm, sglang = blocks(), blocks("runner.engine=sglang")
    assert sglang < 0.65 * vllm
    assert blocks("runner.engine=sglang", "kv_cache.memory_fraction=0.9") > vllm  # nothing held back beside it
    assert blocks("strategy.max_batch_tokens=2048", "strategy.max_num_seqs=256") == vllm
    assert blocks("strategy=static", "strategy.batch_size=32") == vllm
