"""Tensor parallelism, mixtures of experts and calibration from measured runs, in the simulator."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from harness.architecture import Architecture
from harness.config import ConfigError, compose_config, validate
from harness.job import run_job
from harness.model_spec import described_model
from harness.sim.calibrate import default_params, relative_errors, simulate
from harness.sim.costmodel import RooflineCostModel, StepShape
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.measured import MeasuredRunError, load_measured, load_measured_runs
from tests.conftest import ROOT, bare_engine

MULTI_GPU = sorted((ROOT / "tests" / "fixtures" / "published" / "multi_gpu").glob("*.json"))
H100 = get_hardware("h100")


def arch(name: str) -> Architecture:
    return Architecture.from_config(described_model(name), 2)


def decode_step(num_seqs: int, context: int) -> StepShape:
    return StepShape(padded=False, num_tokens=num_seqs, num_sampled=num_seqs, attention_pairs=num_seqs * context,
                     kv_tokens_read=num_seqs * context, num_rows=num_seqs)


def test_tensor_parallel_splits_the_work_and_adds_two_allreduces_a_layer():
    one = RooflineCostModel(arch("llama-3.1-70b"), H100, bare_engine(0.7), 0.5)
    four = RooflineCostModel(arch("llama-3.1-70b"), H100, bare_engine(0.7), 0.5, tensor_parallel=4)
    step = decode_step(64, 1000)
    message = 64 * 8192 * 2  # [T, hidden] in bf16
    expected_allreduce = 2 * 80 * (2 * 3 * 1.5e-6 + 2 * 3 / 4 * message / (0.35 * H100.interconnect_bandwidth / 2))
    assert four.allreduce_s(step) == pytest.approx(expected_allreduce)
    assert four.predict(step) == pytest.approx(one.predict(step) / 4 + expected_allreduce)
    assert one.allreduce_s(step) == 0.0


def test_an_allreduce_pays_a_latency_for_each_step_of_its_ring():
    step = decode_step(1, 0)
    message = 4096 * 2  # one token's [hidden] in bf16
    for n in (2, 4, 8):
        costs = RooflineCostModel(arch("llama-3-8b"), H100, bare_engine(0.7), 0.5, tensor_parallel=n)
        ring_steps = 2 * (n - 1)  # each hands 1/n of the message on
        expected = 2 * 32 * ring_steps * (1.5e-6 + message / n / (0.35 * H100.interconnect_bandwidth / 2))
        assert costs.allreduce_s(step) == pytest.approx(expected)


def test_the_engines_own_time_grows_with_sequences_and_tokens_and_not_with_gpus():
    engine = bare_engine(0.7, step_overhead_s=1e-3, seq_overhead_s=1e-6, token_overhead_s=1e-5)
    costs = [RooflineCostModel(arch("llama-3.1-70b"), H100, engine, 0.5, tensor_parallel=n) for n in (1, 4)]
    prefill = StepShape(False, 2048, 4, 2048 * 300, 2048, 4)
    for model in costs:
        assert model.overhead(prefill, 0.0) == pytest.approx(1e-3 + 4 * 1e-6 + 2048 * 1e-5)
        assert model.overhead(decode_step(64, 1000), 0.0) == pytest.approx(1e-3 + 64 * 1e-6 + 64 * 1e-5)


def test_a_70b_on_one_gpu_is_refused_and_runs_on_four(tmp_path):
    overrides = ["runner=sim", "runner.hardware=h100", "model=llama-3.1-70b", "workload.num_requests=8",
                 "progress=false"]
    with pytest.raises(ConfigError, match=r"weights \(141.1 GB\) do not fit in 90% of H100-SXM's 85 GB; "
                                          r"runner.tensor_parallel=4 would hold them"):
        run_job(compose_config(overrides), tmp_path / "one")
    summary = run_job(compose_config([*overrides, "runner.tensor_parallel=4"]), tmp_path / "four")
    assert summary["num_finished"] == 8 and summary["num_gpus"] == 4


def test_a_degree_that_does_not_divide_the_kv_heads_is_refused(tmp_path):
    cfg = compose_config(["runner=sim", "runner.hardware=h100", "model=llama-3.1-70b", "runner.tensor_parallel=3",
                          "progress=false"])
    with pytest.raises(ConfigError, match="runner.tensor_parallel=3 does not split the model's 64 "
                                          "attention heads and 8 KV heads evenly"):
        run_job(cfg, tmp_path)


def test_a_mixture_of_experts_reads_the_experts_its_tokens_touch():
    mixtral = arch("mixtral-8x7b")
    assert mixtral.experts_touched(1) == pytest.approx(2)  # one token: its top-2
    assert 7.5 < mixtral.experts_touched(16) < 8 and mixtral.experts_touched(4096) == pytest.approx(8)
    one_token, big_batch = mixtral.weight_bytes_read(1), mixtral.weight_bytes_read(4096)
    expert = mixtral.num_layers * mixtral.expert_params * 2
    assert big_batch - one_token == pytest.approx(6 * expert)  # 6 more experts a layer
    assert mixtral.num_params / 1e9 == pytest.approx(46.7, rel=0.01)  # Mixtral-8x7B's published size
    assert mixtral.num_active_params / 1e9 == pytest.approx(12.9, rel=0.02)  # the card counts the embedding
    # Per token, FLOPs follow the active parameters (12.9B), not the total.
    costs = RooflineCostModel(mixtral, H100, bare_engine(0.7), 0.5, tensor_parallel=2)
    assert sum(costs.gemm_flops(decode_step(1, 0))) == pytest.approx(
        2 * mixtral.active_layer_params + 2 * mixtral.embedding_params)


@pytest.mark.parametrize("path", [p for p in MULTI_GPU if "llama" in p.stem], ids=lambda p: p.stem)
def test_the_defaults_predict_a_dense_tensor_parallel_run(path):
    """Dense models on several H100s (the all-reduce figures were fitted to them, the rest on one GPU): throughput
    and TPOT p50 within 10%; TTFT is not held (README "Several GPUs")."""
    run = load_measured(path)
    errors = relative_errors(run, simulate(run, default_params(run)))
    assert abs(errors["output_throughput_tps"]) <= 0.10 and abs(errors["tpot_s_p50"]) <= 0.10, errors


def test_a_calibration_file_replaces_the_defaults_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "calibration.yaml"
    params = {"compute_efficiency": 0.5, "memory_efficiency": 0.8, "step_overhead_s": 0.001,
              "seq_overhead_s": 1e-5, "frontend_latency_s": 0.01, "frontend_service_s": 0.001}
    path.write_text(yaml.safe_dump({"params": params}))
    runner = validate(compose_config(["runner=sim", "runner.hardware=h100", f"runner.calibration={path}"])).runner
    assert (runner.compute_efficiency, runner.memory_efficiency, runner.step_overhead_s) == (0.5, 0.8, 0.001)
    assert runner.token_overhead_s == 0.0  # a file from before the per-token overhead was fitted without one
    path.write_text(yaml.safe_dump({"params": params | {"token_overhead_s": 2e-5}}))
    runner = validate(compose_config(["runner=sim", "runner.hardware=h100", f"runner.calibration={path}"])).runner
    assert runner.token_overhead_s == 2e-5
    path.write_text(yaml.safe_dump({"params": {"compute_efficiency": 0.5}}))
    with pytest.raises(ConfigError, match="is not a file written by python -m harness.sim.calibrate"):
        validate(compose_config(["runner=sim", "runner.hardware=h100", f"runner.calibration={path}"]))


def test_calibrate_fits_measured_runs_and_reports_the_held_out(tmp_path):
    published = ROOT / "tests" / "fixtures" / "published"
    out = tmp_path / "calibration.yaml"
    result = subprocess.run([sys.executable, "-m", "harness.sim.calibrate",
                             str(published / "kvcached-h100-qwen3-0.6b-rate-16.json"), "--hold-out",
                             str(published / "lambda-h100-mistral-7b-10.json"), "--out", str(out),
                             "--evaluations", "10"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    written = yaml.safe_load(out.read_text())
    assert set(written["params"]) == {"compute_efficiency", "memory_efficiency", "step_overhead_s",
                                      "seq_overhead_s", "token_overhead_s", "frontend_latency_s",
                                      "frontend_service_s", "chat_latency_s", "moe_efficiency", "moe_tokens_half",
                                      "expert_overhead_s", "moe_layer_overhead_s"}
    assert written["errors"]["kvcached-h100-qwen3-0.6b-rate-16"]["output_throughput_tps"] == pytest.approx(0,
                                                                                                           abs=0.05)
    assert "held out" in result.stdout and "lambda-h100-mistral-7b-10" in result.stdout


def test_calibrate_refuses_a_run_without_lengths(tmp_path):
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"num_prompts": 4, "output_throughput": 10.0, "hardware": "h100",
                               "model": "llama-3.1-8b"}))
    result = subprocess.run([sys.executable, "-m", "harness.sim.calibrate", str(bad)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "does not say its requests' lengths" in result.stderr


def test_fidelity_reports_predicted_beside_measured(tmp_path):
    published = ROOT / "tests" / "fixtures" / "published"
    result = subprocess.run([sys.executable, "-m", "harness.sim.fidelity", "--measured",
                             str(published / "kvcached-h100-qwen3-0.6b-rate-16.json"), "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    table = pd.read_csv(tmp_path / "fidelity_measured.csv")
    assert set(table.metric) >= {"output_throughput_tps", "tpot_s_p50", "ttft_s_p50"}
    row = table[table.metric == "output_throughput_tps"].iloc[0]
    assert row.error == pytest.approx((row.predicted - row.measured) / row.measured)
    assert (tmp_path / "fidelity_measured.png").is_file()


def test_a_run_folder_is_a_measured_run_the_simulator_reproduces(tmp_path):
    # A simulated run of the defaults, read back as a measured run (its requests table is the workload) and
    # replayed with the same defaults, must give its own figures back; a folder that does not name its GPU is named.
    run_job(compose_config(["runner=sim", "runner.hardware=h100", "model=llama-3.1-8b", "workload.num_requests=60",
                            "workload.rate=12", "workload.max_concurrency=24", "progress=false",
                            "results.tables=parquet"]), tmp_path / "run")
    (run,) = load_measured_runs([str(tmp_path)])
    assert (run.hardware, run.model, run.max_concurrency, len(run.requests)) == ("h100", "llama-3.1-8b", 24, 60)
    predicted = simulate(run, default_params(run))
    for metric, measured in run.metrics.items():
        assert predicted[metric] == pytest.approx(measured, rel=1e-9), metric
    config = (tmp_path / "run" / "config.yaml").read_text()
    (tmp_path / "run" / "config.yaml").write_text(config.replace("name: sim", "name: openai"))
    with pytest.raises(MeasuredRunError, match="say which GPU it ran on"):
        load_measured_runs([str(tmp_path / "run")])
    assert load_measured_runs([str(tmp_path / "run")], {"hardware": "h200"})[0].hardware == "h200"


def test_ttfts_a_benchmark_counted_as_zero_count_as_zero_in_the_prediction(tmp_path):
    # vLLM 0.5's client recorded TTFT 0 for an empty completion and averaged it in; the prediction is read alike.
    data = json.loads((ROOT / "tests" / "fixtures" / "published" / "lambda-h100-mistral-7b-10.json").read_text())
    del data["setup"]["empty_completion_ttft"]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    plain = load_measured(path)
    assert plain.zero_ttft_requests == frozenset()
    data["setup"]["empty_completion_ttft"] = "zero"
    path.write_text(json.dumps(data))
    empty = [i for i, n in enumerate(data["output_lens"]) if n == 0]
    assert empty and load_measured(path).zero_ttft_requests == frozenset(empty)
    data["ttfts"] = [0.0 if i < 6 else 0.05 for i in range(len(data["output_lens"]))]  # saved: they say which
    path.write_text(json.dumps(data))
    counted = load_measured(path)
    assert counted.zero_ttft_requests == frozenset(range(6))
    params = default_params(plain)
    assert simulate(plain, params)["ttft_s_p50"] > 0
    assert simulate(counted, params)["ttft_s_p50"] == 0.0  # six of ten at zero
    assert simulate(counted, params)["output_throughput_tps"] == simulate(plain, params)["output_throughput_tps"]
    data["setup"]["empty_completion_ttft"] = "zeros"
    path.write_text(json.dumps(data))
    with pytest.raises(MeasuredRunError, match="setup.empty_completion_ttft is zero or timed, not 'zeros'"):
        load_measured(path)


@pytest.mark.parametrize("gpus,meets", [(2, False), (4, True)])
def test_the_capacity_experiment_answers_four_gpus_as_one_engine(gpus, meets, tmp_path):
    # experiment=capacity_70b's question on a shorter stretch of its traffic: TP 4 meets both SLOs for every
    # request, TP 2 cannot hold the sequences its 10 req/s keep in flight and falls behind.
    config = compose_config(["experiment=capacity_70b", "strategy=continuous", f"runner.tensor_parallel={gpus}",
                             "workload.num_requests=400", "progress=false"])
    summary = run_job(config, tmp_path / "run")
    assert summary["num_gpus"] == gpus and summary["num_finished"] == 400
    met = summary["goodput_rps"] == pytest.approx(summary["request_throughput_rps"])
    assert met == meets and (summary["ttft_s_p99"] <= 2.0) == meets
    assert (summary["num_preemptions"] > 0) == (not meets)
