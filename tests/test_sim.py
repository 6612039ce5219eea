"""The simulator: cost models, the same schedule as the real runner, clusters, and whole simulated runs."""

import dataclasses
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from harness.architecture import Architecture
from harness.config import ConfigError, compose_config
from harness.core.engine import Engine
from harness.core.replay import replay
from harness.core.replica import build_replica
from harness.job import run_job
from harness.model_spec import described_model
from harness.real.runner import RealRunner
from harness.run_parts import CPU_NUM_BLOCKS
from harness.sim.costmodel import CalibratedCostModel, RooflineCostModel, StepShape
from harness.sim.costmodel.calibrated import GridInterpolator
from harness.sim.costmodel.hardware import Hardware, get_hardware
from harness.sim.costmodel.startup_memory import profile_run_bytes
from harness.sim.decoders import DecodeSet
from harness.sim.engine_profile import get_engine
from harness.sim.replica import SIMULATED_ENGINES, auto_num_blocks, simulated_engine
from harness.sim.router import ROUTERS
from harness.sim.runner import SimRunner
from harness.sim.sglang import SimSGLang
from strategies import Request, RequestStatus, sglang
from tests.conftest import ROOT, ScriptedRunner, StepCost, assert_same_records, bare_engine, make_specs

LLAMA_7B = Architecture(32, 4096, 11008, 32, 32, 128, 32000, 2)


def made_up_cost(tokens: float, context: float, padded: bool = False) -> float:
    """1 ms + 10 us per token + 1 ns per query-key pair (+0.2 ms padded): bilinear in (tokens, context)."""
    return 1e-3 + 1e-5 * tokens + 1e-9 * tokens * context + (2e-4 if padded else 0.0)


def profile_table() -> pd.DataFrame:
    """A made-up profile of `made_up_cost` on a grid."""
    rows = [(layout, t, c, made_up_cost(t, c, layout == "padded"))
            for layout in ("ragged", "padded") for t in (1, 4, 16, 64) for c in (1, 32, 128)]
    return pd.DataFrame(rows, columns=["layout", "num_tokens", "mean_context", "duration_s"])


def shape(tokens: int, context: float, padded: bool = False) -> StepShape:
    return StepShape(padded, tokens, min(tokens, 16), int(tokens * context), tokens, 1)


def test_calibrated_model_is_exact_on_grid_points():
    table = profile_table()
    model = CalibratedCostModel(table)
    for row in table.itertuples():
        assert model.predict(shape(row.num_tokens, row.mean_context, row.layout == "padded")) == pytest.approx(
            row.duration_s, rel=1e-12)


@pytest.mark.parametrize("tokens,context", [(40, 80), (4096, 2000), (4, 0.5), (200, 3)])
def test_calibrated_model_interpolates_and_extrapolates_linearly_without_failing(tokens, context):
    """Bilinear interpolation, and linear extrapolation along the edge segments, reproduce a bilinear cost
    exactly: between grid points and far beyond them (no error, no clamp)."""
    model = CalibratedCostModel(profile_table())
    assert model.predict(shape(tokens, context)) == pytest.approx(made_up_cost(tokens, context), rel=1e-9)


def test_calibrated_model_is_monotonic_in_tokens_even_on_noisy_profiles():
    noisy = profile_table()
    noisy.loc[(noisy.num_tokens == 16) & (noisy.layout == "ragged"), "duration_s"] *= 0.5  # a noisy dip
    model = CalibratedCostModel(noisy)
    predictions = [model.predict(shape(t, 32)) for t in range(1, 200, 3)]
    assert all(b >= a for a, b in zip(predictions, predictions[1:]))


def test_unmeasured_grid_cells_are_filled_along_the_row():
    table = profile_table()
    table = table[~((table.num_tokens == 64) & (table.mean_context == 1))]  # infeasible: 64-token chunk, 1 key
    grid = GridInterpolator.from_points(table[table.layout == "ragged"])
    # Extended along its row, never below the row's cheapest measurement (fewer keys cannot cost less than that).
    assert grid.values[3, 0] == pytest.approx(made_up_cost(64, 32), rel=1e-12)
    assert grid.values[3, 1:] == pytest.approx([made_up_cost(64, 32), made_up_cost(64, 128)], rel=1e-12)


def test_a_profile_without_both_layouts_is_refused(tmp_path):
    with pytest.raises(ValueError, match="both ragged and padded"):
        CalibratedCostModel(profile_table()[lambda t: t.layout == "ragged"])
    path = tmp_path / "p.csv"
    path.write_text("# step_overhead_s: 0.001\n" + profile_table().to_csv(index=False))
    assert CalibratedCostModel.load(path).step_overhead_s == 0.001


def test_roofline_decode_is_memory_bound_and_a_big_prefill_compute_bound():
    model = RooflineCostModel(LLAMA_7B, get_hardware("h100"), bare_engine(1.0), compute_efficiency=1.0)
    decode = StepShape(False, 1, 1, 100, 100, 1, 100)
    weights_and_kv = LLAMA_7B.weight_bytes_read(1) + model.kv_bytes(decode)
    assert model.predict(decode) == pytest.approx(weights_and_kv / get_hardware("h100").memory_bandwidth)
    prefill = StepShape(False, 8192, 1, 8192 * 4096, 8192, 1)
    flops = sum(model.gemm_flops(prefill)) + model.attention_flops(prefill)
    assert model.predict(prefill) == pytest.approx(flops / get_hardware("h100").peak_flops)
    assert 6.7e9 < LLAMA_7B.weight_bytes / 2 < 6.8e9  # Llama-2-7B has 6.74B parameters
    assert LLAMA_7B.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2  # 512 KiB per token in bf16
    expected = int((0.9 * 85.06e9 - LLAMA_7B.weight_bytes) // (16 * LLAMA_7B.kv_bytes_per_token))  # as CUDA reports it
    assert model.num_kv_blocks(16, 0.9) == expected
    with pytest.raises(ValueError, match="do not fit"):
        RooflineCostModel(LLAMA_7B, get_hardware("l4"), bare_engine()).num_kv_blocks(16, 0.5)


def test_the_dense_gemms_a_gpu_check_measures_are_the_step_less_its_attention():
    """`dense_gemm_s`, which `harness.gpu_check` puts beside measured GEMMs: the weights' stream in a decode, their
    FLOPs in a big prefill, and with the attention the whole step."""
    h100 = get_hardware("h100")
    model = RooflineCostModel(LLAMA_7B, h100, bare_engine(1.0), compute_efficiency=1.0)
    decode = StepShape(False, 1, 1, 100, 100, 1, 100)
    assert model.dense_gemm_s(decode) == pytest.approx(LLAMA_7B.dense_weight_bytes_read() / h100.memory_bandwidth)
    assert model.predict(decode) == pytest.approx(model.dense_gemm_s(decode) + model.kv_bytes(decode)
                                                  / h100.memory_bandwidth)
    prefill = StepShape(False, 8192, 1, 8192 * 4096, 8192, 1)
    assert model.dense_gemm_s(prefill) == pytest.approx(model.gemm_flops(prefill)[0] / h100.peak_flops)
    assert model.predict(prefill) == pytest.approx(model.dense_gemm_s(prefill) + model.attention_flops(prefill)
                                                   / h100.peak_flops)


def test_each_dense_gemm_adds_the_gpus_fixed_time_and_tensor_parallelism_does_not_split_it():
    """`Hardware.gemm_fixed_s`: a decode step of Llama-3.1-8B on the H200 (its file's 4,130 GB/s and 3.9 µs, measured
    by the GPU check) runs 129 GEMMs, four a layer and the LM head, each with its fixed time on every GPU of a TP
    group, for an engine that takes the GPU's measured stream; a GPU whose file measured none adds nothing."""
    llama = Architecture.from_config(described_model("llama-3.1-8b"), 2)
    assert llama.num_dense_gemms == 4 * 32 + 1
    # DeepSeek-V3: MLA's five a layer, three dense MLP layers' two, 58 MoE layers' router and shared expert, the head
    assert Architecture.from_config(described_model("deepseek-v3"), 2).num_dense_gemms == 61 * 5 + 3 * 2 + 58 * 3 + 1
    h200 = get_hardware("h200")
    assert (h200.gemm_fixed_s, h200.stream_bandwidth) == (pytest.approx(3.9e-6), pytest.approx(4.13e12))
    decode = StepShape(False, 16, 16, 16, 16, 16, 16)
    capped = dataclasses.replace(bare_engine(1.0), stream_bandwidth_cap=True)
    unmeasured = dataclasses.replace(h200, gemm_fixed_s=0.0)
    for n in (1, 2):
        fixed = RooflineCostModel(llama, h200, capped, tensor_parallel=n).dense_gemm_s(decode)
        assert fixed - RooflineCostModel(llama, unmeasured, capped, tensor_parallel=n).dense_gemm_s(decode) == \
            pytest.approx(129 * 3.9e-6)
    assert get_hardware("h100").gemm_fixed_s == 0.0
    # An engine fitted with each GPU's shortfall in its own share (`vllm-0.5`) takes neither measured figure.
    assert RooflineCostModel(llama, h200, bare_engine(1.0)).dense_gemm_s(decode) == \
        RooflineCostModel(llama, unmeasured, bare_engine(1.0)).dense_gemm_s(decode)


@pytest.mark.parametrize("strategy,options", [("static", dict(batch_size=3)), ("dynamic", dict(batch_size=3)),
                                              ("continuous", dict(max_batch_tokens=16, max_num_seqs=3))])
def test_real_and_simulated_runs_make_the_same_schedule(strategy, options, runner_model):
    specs = make_specs([(12, 4), (5, 6), (20, 2), (7, 5), (3, 3)], arrivals=[0.0, 0.0, 0.03, 0.05, 0.2])
    cost = StepCost(0.004, per_token_s=1e-4, per_pair_s=1e-6)
    schedules = []
    for make_runner, engine_class in ((lambda a: ScriptedRunner(RealRunner(runner_model, a), cost), Engine),
                                      (lambda a: SimRunner(cost), simulated_engine)):
        engine = build_replica(strategy, options, make_runner, num_blocks=64, block_size=4, max_model_len=2048,
                               engine_class=engine_class)
        records = engine.run(specs)
        schedules.append(records.steps.frame()[["start_s", "num_prefill_tokens", "num_decode_tokens",
                                                "num_padding_tokens", "num_seqs"]])
    pd.testing.assert_frame_equal(schedules[0], schedules[1])


def cluster(router: str, replicas: int = 3):
    engines = [build_replica("continuous", dict(max_batch_tokens=32, max_num_seqs=4),
                             lambda a: SimRunner(StepCost(0.02)), num_blocks=64, block_size=4, max_model_len=2048,
                             engine_class=simulated_engine) for _ in range(replicas)]
    specs = make_specs([(8, 3 + (i % 5) * 4) for i in range(30)], arrivals=[0.01 * i for i in range(30)])
    return engines, specs, ROUTERS[router]()


def test_round_robin_spreads_requests_in_turn():
    engines, specs, route = cluster("round_robin")
    replay(engines, specs, route)
    for i, engine in enumerate(engines):
        assert [r.request_id for r in engine.records.requests] == list(range(i, 30, 3))
        assert all(r.status == RequestStatus.FINISHED for r in engine.records.requests)


def test_least_outstanding_picks_the_least_loaded_replica_at_each_arrival():
    engines, specs, route = cluster("least_outstanding")
    seen = []

    def watching(engines, spec):
        loads = [e.num_outstanding for e in engines]
        target = route(engines, spec)
        seen.append(loads[engines.index(target)] == min(loads))
        return target

    replay(engines, specs, watching)
    assert all(seen) and len(seen) == 30
    assert sum(len(e.records.requests) for e in engines) == 30
    assert all(e.allocator.num_used_blocks == 0 for e in engines)


def sim_config(*overrides: str):
    return compose_config(["runner=sim", "progress=false", *overrides])


def test_a_roofline_simulation_of_llama_2_7b_on_an_h100(tmp_path):
    summary = run_job(sim_config("model=llama-2-7b", "runner.hardware=h100", "workload.num_requests=40",
                                 "workload.rate=8", "concurrency=64"), tmp_path)
    assert summary["num_finished"] == 40 and summary["cost_model"] == "RooflineCostModel"
    h100 = get_hardware("h100")
    costs = RooflineCostModel(LLAMA_7B, h100, get_engine("vllm-v1"))  # the default profile sizes the cache as vLLM
    assert summary["num_blocks"] == costs.num_kv_blocks(16, None, h100.serving_defaults)
    held = profile_run_bytes(LLAMA_7B, 8192, 1024)  # its profile run at an H100's caps: 8,192 tokens, 1,024 rows
    assert summary["num_blocks"] == (0.9 * h100.memory_bytes - held - LLAMA_7B.weight_bytes) // (
        16 * LLAMA_7B.kv_bytes_per_token) < RooflineCostModel(LLAMA_7B, h100, bare_engine()).num_kv_blocks(16, 0.9)
    # A 7B model decodes in milliseconds per token on an H100, no faster than its weights stream at the datasheet rate.
    assert LLAMA_7B.weight_bytes / h100.memory_bandwidth < summary["tpot_s_p50"] < 0.05
    assert (tmp_path / "plots" / "steps.png").exists()


def test_a_simulated_cluster_reports_each_replica(tmp_path):
    # Synchronous scheduling, so that the host's time shows beside the GPU's (async hides it behind a 7B decode).
    summary = run_job(sim_config("model=llama-2-7b", "runner.hardware=h100", "workload.num_requests=30",
                                 "workload.rate=20", "runner.replicas=3", "runner.router=least_outstanding",
                                 "runner.async_scheduling=false"), tmp_path)
    assert summary["replicas"] == 3 and summary["num_finished"] == 30
    replicas = pd.read_csv(tmp_path / "replicas.csv")
    assert len(replicas) == 3 and replicas.num_finished.sum() == 30
    assert set(pd.read_csv(tmp_path / "steps.csv").replica) == {0, 1, 2}
    # Where the time went, in replica-seconds: busy, overhead and idle add up to the makespan of each replica.
    assert summary["replica_s"] == pytest.approx(3 * summary["makespan_s"])
    parts = summary["busy_s"] + summary["overhead_s"] + summary["idle_s"]
    assert parts == pytest.approx(summary["replica_s"]) and summary["idle_s"] > 0 and summary["overhead_s"] > 0
    assert "(3 replicas' time)" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("overrides,message", [
    (["model=tiny-llama"], "needs runner.hardware"),
    (["runner.hardware=tpu-v9"], "unknown hardware 'tpu-v9'"),
    (["runner.hardware=h100", "stop_at_eos=true"], "stop_at_eos needs runner=real"),
    (["runner.profile=/no/such.csv"], "does not exist"),
])
def test_bad_simulation_configs_are_named(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        run_job(sim_config(*overrides), tmp_path)


SMALL_LLAMA = ["model.config.hidden_size=64", "model.config.intermediate_size=128",
               "model.config.num_hidden_layers=2", "model.config.num_attention_heads=4",
               "model.config.num_key_value_heads=2", "model.config.vocab_size=512"]


def test_a_described_model_runs_for_real_on_seeded_random_weights(tmp_path):
    """Any described architecture (here Llama-2-7B's, shrunk) runs on the real runner; the summary says its
    outputs are meaningless; the same seed gives the same tokens."""
    tokens = []
    for run in ("a", "b"):
        cfg = compose_config(["model=llama-2-7b", *SMALL_LLAMA, "workload=random", "workload.num_requests=3",
                              "workload.input_len=8", "workload.output_len=4", "save_tokens=true", "progress=false"])
        summary = run_job(cfg, tmp_path / run)
        assert summary["num_finished"] == 3 and summary["weights"].startswith("random")
        tokens.append((tmp_path / run / "tokens.jsonl").read_text())
    assert tokens[0] == tokens[1]


def test_the_speed_benchmark_times_every_schedule_and_a_steps_prediction_alone_and_in_a_stretch(monkeypatch, capsys):
    from harness.sim import bench

    monkeypatch.setattr(sys, "argv", ["bench", "--requests", "10", "--e2e-requests", "0", "--trace-rows", "0",
                                      "--predicted-steps", "300"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[0] in bench.SCHEDULES]
    assert [(row[0], row[1], int(row[2])) for row in rows] == [
        (schedule, load, replicas) for schedule in bench.SCHEDULES for load in bench.LOADS for replicas in (1, 8)]
    assert all(float(row[3]) > 0 and int(row[4]) > 0 for row in rows)
    [prediction] = [line for line in lines if line.startswith("one step's cost predicted (300 steps)")]
    alone, in_stretch = (float(value) for value in re.findall(r"([0-9.]+) µs", prediction))
    assert alone > in_stretch > 0


def test_profile_then_simulate(tmp_path):
    profile = tmp_path / "profile.csv"
    result = subprocess.run([sys.executable, "-m", "harness.sim.step_profile", "--quick", "--repeats", "1", "--out",
                             str(profile)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "# step_overhead_s:" in profile.read_text()
    model = CalibratedCostModel.load(profile)
    assert {"ragged", "padded"} == set(model.layouts)
    summary = run_job(sim_config(f"runner.profile={profile}", "workload.num_requests=8"), tmp_path / "run")
    assert summary["num_finished"] == 8 and summary["cost_model"] == "CalibratedCostModel"
    # It predicts this harness's own engine, in process: no API server's front end between a request and its engine.
    requests = pd.read_csv(tmp_path / "run" / "requests.csv")
    assert requests.first_scheduled_s.min() == requests.sent_s.min() == 0.0


@pytest.mark.parametrize("strategy,options,scheduler,eviction", [
    ("static", dict(batch_size=4), "vllm", "auto"), ("dynamic", dict(batch_size=4), "vllm", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=4), "vllm", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=4), "vllm", "empty_first"),
    ("continuous", dict(max_batch_tokens=20, max_num_seqs=6, max_prefill_chunk=7), "vllm", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=4, admission="whole_prompt"), "vllm", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=6), "sglang", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=10, max_prefill_chunk=12), "sglang", "auto"),
    ("continuous", dict(max_batch_tokens=24, max_num_seqs=6, recv_interval=4), "sglang", "auto")])
@pytest.mark.parametrize("replicas,max_concurrency,prefix_caching", [(1, None, False), (3, 5, False), (1, None, True),
                                                                     (1, 5, True), (3, None, True)])
def test_simulated_engines_make_exactly_the_records_of_the_step_by_step_engine(strategy, options, scheduler, eviction,
                                                                                 replicas, max_concurrency,
                                                                                 prefix_caching):
    lengths = [(5 + 7 * (i % 4), 3 + 11 * (i % 5)) for i in range(60)]
    specs = make_specs(lengths, arrivals=[0.02 * i for i in range(60)])
    cost = StepCost(0.004, per_token_s=1e-4, per_pair_s=1e-6, step_overhead_s=0.001)  # shape-dependent
    runs = []
    for engine_class in (Engine, simulated_engine):
        # 40 blocks: small enough for continuous to preempt
        engines = [build_replica(strategy, options, lambda a: SimRunner(cost), num_blocks=40, block_size=4,
                                 max_model_len=2048, engine_class=engine_class, prefix_caching=prefix_caching,
                                 scheduler=scheduler, eviction=eviction)
                   for _ in range(replicas)]
        calls = Counter()
        for engine in engines:
            step = engine.step
            engine.step = lambda arrivals, step=step, calls=calls: calls.update(["step"]) or step(arrivals)
        replay(engines, specs, ROUTERS["least_outstanding"]() if replicas > 1 else None,
               max_concurrency=max_concurrency, frontend_latency_s=0.003, frontend_service_s=0.001)
        runs.append(engines)
    assert_same_records(*runs)
    assert type(runs[1][0]) is (SimSGLang if scheduler == "sglang" else SIMULATED_ENGINES[strategy])
    num_steps = sum(len(e.records.steps) for e in runs[1])
    if strategy == "continuous":
        if replicas == 1:  # spread over replicas, the cache holds out
            assert sum(r.num_preemptions for e in runs[1] for r in e.records.requests) > 0
            if prefix_caching:  # a preempted request found its own prompt again, and the cache evicted
                assert sum(e.records.steps.column("num_cached_tokens").sum() for e in runs[1]) > 0
                assert runs[1][0].allocator.num_evictions > 0
    elif replicas == 1:  # decode-only stretches run as one call each
        assert calls["step"] < num_steps / 2


@pytest.mark.parametrize("strategy,options,scheduler", [
    ("static", dict(batch_size=4), "vllm"), ("dynamic", dict(batch_size=4), "vllm"),
    ("continuous", dict(max_batch_tokens=32, max_num_seqs=4), "vllm"),
    ("continuous", dict(max_batch_tokens=32, max_num_seqs=4), "sglang"),
    ("continuous", dict(max_batch_tokens=32, max_num_seqs=4, recv_interval=10), "sglang")])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_long_decode_stretches_run_in_bulk_with_the_same_records(strategy, options, scheduler, prefix_caching):
    # Low load, long outputs, a cache that runs out late: long decode-only stretches, a few cut by the cache.
    lengths = [(3 + 5 * (i % 3), 40 + 30 * (i % 4)) for i in range(30)]
    specs = make_specs(lengths, arrivals=[0.15 * i + 0.05 * (i % 3) for i in range(30)])
    cost = StepCost(0.004, per_token_s=1e-4, per_pair_s=1e-6, step_overhead_s=0.001)
    runs, calls = [], Counter()
    for engine_class in (Engine, simulated_engine):
        engine = build_replica(strategy, options, lambda a: SimRunner(cost), num_blocks=60, block_size=4,
                               max_model_len=2048, engine_class=engine_class, prefix_caching=prefix_caching,
                               scheduler=scheduler)
        step = engine.step
        engine.step = lambda arrivals, step=step, name=engine_class.__name__: calls.update([name]) or step(arrivals)
        replay([engine], specs)
        runs.append([engine])
    assert_same_records(*runs)
    assert calls["simulated_engine"] < len(runs[1][0].records.steps) / 3


def test_the_decoders_full_blocks_are_kept_step_by_step_as_each_members_own_would_sum():
    # Members join with any computed count and leave or finish at any step; asked at the next step, after a jump of
    # several blocks' worth of steps, at a step already passed, or for a stretch, the count is the members' own sum.
    rng = np.random.default_rng(0)
    decoders, requests, step = DecodeSet(block_size=4), {}, 0
    for _ in range(400):
        action = rng.integers(4)
        if action == 0 or not decoders:
            request = Request(len(requests), 0.0, [], int(rng.integers(1, 30)), int(rng.integers(2, 60)))
            requests[request.request_id] = request
            decoders.join(request, step, int(rng.integers(request.num_prompt_tokens, request.max_num_tokens)))
        elif action == 1:
            decoders.leave(requests[int(rng.choice(list(decoders.base)))], step)
        elif action == 2:
            decoders.finishing(int(rng.integers(step - 5, step + 5)))
        step = max(0, step + int(rng.choice([1, 1, 1, 9, -3])))
        expected = sum((base + step + 1) // 4 for base in decoders.base.values())
        assert decoders.num_full_blocks(step) == expected
        stretch = step + np.arange(7)
        assert decoders.num_full_blocks(stretch).tolist() == [
            sum((base + s + 1) // 4 for base in decoders.base.values()) for s in stretch]


def test_sglang_outputs_beyond_its_estimates_clip_make_the_same_records(monkeypatch):
    # Outputs of 6,000-9,000 tokens: SGLang's reserve counts at most 4,096 of each decoder's output to come, until
    # it has fewer left; a cache of 1,500 blocks that the clipped reserve fills until decoders retract.
    specs = make_specs([(300 + 97 * i, 6000 + 1000 * (i % 4)) for i in range(8)], arrivals=[0, 0, 0, 1, 2, 3, 4, 5])
    cost = StepCost(0.002, per_token_s=1e-6, per_pair_s=1e-9, step_overhead_s=0.0005)

    def run(engine_class):
        engine = build_replica("continuous", dict(max_batch_tokens=512, max_num_seqs=8), lambda a: SimRunner(cost),
                               num_blocks=1500, block_size=16, max_model_len=65536, engine_class=engine_class,
                               scheduler="sglang")
        replay([engine], specs)
        return engine

    reference, simulated = run(Engine), run(simulated_engine)
    assert_same_records([reference], [simulated])
    assert sum(r.num_preemptions for r in reference.records.requests) > 0
    monkeypatch.setattr(sglang, "CLIP_MAX_NEW_TOKENS", 10**9)  # the clip mattered: unclipped, another schedule
    assert not run(Engine).records.steps.frame().equals(reference.records.steps.frame())


def test_options_the_simulated_engine_does_not_cover_run_step_by_step():
    for options in (dict(max_batch_tokens=24, max_num_seqs=4, order="prefill_first"),
                    dict(max_batch_tokens=4, max_num_seqs=8)):  # decoders beyond the budget
        engine = build_replica("continuous", options, lambda a: SimRunner(StepCost()), num_blocks=40, block_size=4,
                               max_model_len=2048, engine_class=simulated_engine)
        assert type(engine) is Engine
        assert engine.run(make_specs([(9, 5)] * 10)).requests[-1].status == RequestStatus.FINISHED


def test_a_cpu_gets_the_real_cpu_runs_cache_whatever_its_name():
    cpu = Hardware("my laptop", 1e12, 50e9, 16e9, kind="cpu")
    arch = Architecture(4, 256, 688, 8, 2, 32, 8192, 4)
    cfg = sim_config()
    assert auto_num_blocks(RooflineCostModel(arch, cpu, bare_engine()), cfg, (256, 2048)) == CPU_NUM_BLOCKS
    gpu = Hardware("cpu-named accelerator", 1e15, 3e12, 80e9)
    engine = bare_engine()
    assert auto_num_blocks(RooflineCostModel(arch, gpu, engine), cfg, (256, 2048)) == RooflineCostModel(
        arch, gpu, engine).num_kv_blocks(16, 0.9)


def test_a_big_run_writes_parquet_tables_and_may_summarise_its_steps(tmp_path):
    overrides = ["model=llama-2-7b", "runner.hardware=h100", "workload.num_requests=300", "workload.rate=30"]
    full = run_job(sim_config(*overrides), tmp_path / "csv")
    summary = run_job(sim_config(*overrides, "results.tables=parquet", "results.steps=summary"), tmp_path / "parquet")
    assert {k: v for k, v in summary.items() if k != "time"} == {k: v for k, v in full.items() if k != "time"}
    requests = pd.read_parquet(tmp_path / "parquet" / "requests.parquet")
    pd.testing.assert_frame_equal(requests, pd.read_csv(tmp_path / "csv" / "requests.csv", keep_default_na=False,
                                                        dtype={"reject_reason": str}), check_dtype=False)
    assert not (tmp_path / "parquet" / "steps.parquet").exists() and (tmp_path / "csv" / "steps.csv").exists()
    assert (tmp_path / "parquet" / "plots" / "steps.png").exists()  # the steps are plotted all the same
    assert "`requests.parquet`" in (tmp_path / "parquet" / "report.md").read_text()


def test_a_simulated_workload_has_lengths_and_arrivals_but_no_prompt_ids():
    from workloads import build_workload

    cfg = sim_config("workload.num_requests=50", "workload.rate=4").workload
    with_ids, lengths_only = build_workload(cfg, 32000), build_workload(cfg, 32000, with_ids=False)
    assert [(r.arrival_s, r.prompt_len, r.max_new_tokens) for r in with_ids.requests] == [
        (r.arrival_s, r.prompt_len, r.max_new_tokens) for r in lengths_only.requests]
    assert all(r.prompt_ids == () for r in lengths_only.requests)
    assert all(len(r.prompt_ids) == r.prompt_len for r in with_ids.requests)
