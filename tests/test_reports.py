"""Metric definitions on hand-computed cases, run plots, and sweeps ending in a comparison."""

import json
import math
import os
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.analysis import metrics
from harness.analysis.compare import write_comparison
from harness.analysis.report import duration
from harness.analysis.results import RunStatus, write_json, write_status, write_text
from harness.core.records import RunRecords, StepLog
from strategies import Request, RequestStatus
from tests.conftest import ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def finished_request(request_id, arrival, token_times, prompt_len=5, first_scheduled=None):
    request = Request(request_id=request_id, arrival_s=arrival, token_ids=[0] * (prompt_len + len(token_times)),
                      num_prompt_tokens=prompt_len, max_new_tokens=len(token_times), num_output_tokens=len(token_times),
                      status=RequestStatus.FINISHED)
    request.token_times_s = list(token_times)
    request.first_token_s, request.finish_s = token_times[0], token_times[-1]
    request.first_scheduled_s = arrival if first_scheduled is None else first_scheduled
    return request


def step(index, start, duration, prefill=0, decode=0, padding=0, kv=0, busy=None) -> dict:
    return dict(step=index, start_s=start, duration_s=duration, busy_s=duration if busy is None else busy,
                num_prefill_tokens=prefill, num_decode_tokens=decode, num_padding_tokens=padding, num_rows=1,
                row_width=0, num_preempted=0, num_waiting=0, num_seqs=1, kv_used_blocks=kv, num_lookup_tokens=0,
                num_cached_tokens=0, kv_cached_blocks=0)


def step_log(*steps: dict) -> StepLog:
    log = StepLog()
    for s in steps:
        log.append(**s)
    return log


def test_tpot_excludes_the_first_token_and_is_undefined_for_one_token():
    records = RunRecords(requests=[finished_request(0, 0.0, [1.0, 1.5, 3.0]), finished_request(1, 0.5, [2.0])])
    table = metrics.requests_table(records)
    assert table.ttft_s.tolist() == [1.0, 1.5]
    assert table.tpot_s[0] == pytest.approx((3.0 - 1.0) / 2) and math.isnan(table.tpot_s[1])
    assert table.e2e_s.tolist() == [3.0, 1.5]
    values, weights = metrics.inter_token_latencies([records])
    assert sorted(values.tolist()) == [0.5, 1.5] and weights.tolist() == [1, 1]


def test_gaps_counted_per_step_read_as_the_same_gaps_one_by_one():
    # Two requests decode at steps 1 and 2 (gaps of each step's length), one gap of 0.25 s is recorded alone.
    records = RunRecords(steps=step_log(step(0, 0.0, 1.0), step(1, 1.0, 0.5), step(2, 1.5, 2.0)))
    records.gaps_per_step.extend([0, 2, 2])
    records.other_gaps.append(0.25)
    values, weights = metrics.inter_token_latencies([records])
    assert sorted(np.repeat(values, weights).tolist()) == [0.25, 0.5, 0.5, 2.0, 2.0]


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5)), min_size=1, max_size=30))
def test_weighted_percentiles_are_numpys_on_the_repeated_values(pairs):
    values, weights = np.array([v for v, _ in pairs]), np.array([w for _, w in pairs])
    repeated = np.repeat(values, weights)
    weighted = metrics.distribution("x", values, weights)
    if repeated.size == 0:
        assert all(math.isnan(v) for v in weighted.values())
        return
    for p in metrics.PERCENTILES:
        assert weighted[f"x_p{p}"] == np.percentile(repeated, p)
    assert weighted["x_mean"] == pytest.approx(repeated.mean())


def test_percentiles_on_tiny_lists():
    assert metrics.distribution("x", [4.0, 1.0, 3.0, 2.0]) == {
        "x_mean": 2.5, "x_p50": 2.5, "x_p90": pytest.approx(3.7), "x_p99": pytest.approx(3.97)}
    assert metrics.distribution("x", [7.0]) == {"x_mean": 7.0, "x_p50": 7.0, "x_p90": 7.0, "x_p99": 7.0}
    assert all(math.isnan(v) for v in metrics.distribution("x", [math.nan]).values())


def test_padding_waste_throughput_goodput_and_overhead_of_a_known_run():
    requests = [finished_request(0, 0.0, [1.0, 2.0]), finished_request(1, 0.0, [1.0, 4.0], prompt_len=3)]
    steps = [step(0, 0.0, 1.0, prefill=8, padding=2, kv=4, busy=0.9), step(1, 1.0, 1.0, decode=2, kv=4, busy=0.9),
             step(2, 3.0, 1.0, decode=1, padding=1, kv=2, busy=0.8)]  # an idle second between steps 1 and 2
    records = RunRecords(requests=requests, steps=step_log(*steps))
    summary = metrics.summarize(metrics.requests_table(records), metrics.steps_table(records, num_blocks=8),
                                metrics.inter_token_latencies([records]), {}, slo_ttft_s=1.0, slo_tpot_s=2.0)
    assert summary["num_padding_tokens"] == 3 and summary["num_computed_tokens"] == 14
    assert summary["padding_waste"] == pytest.approx(3 / 14)
    assert summary["makespan_s"] == 4.0
    assert summary["output_throughput_tps"] == pytest.approx(4 / 4.0)
    assert summary["total_throughput_tps"] == pytest.approx((4 + 8) / 4.0)
    assert summary["goodput_rps"] == pytest.approx(1 / 4.0)  # request 1's TPOT is 3 s > 2 s
    assert summary["kv_peak_utilization"] == 0.5
    assert summary["kv_mean_utilization"] == pytest.approx((0.5 + 0.5 + 0.25) / 3)
    assert summary["busy_s"] == pytest.approx(2.6) and summary["overhead_s"] == pytest.approx(0.4)
    assert summary["idle_s"] == pytest.approx(1.0)
    assert summary["tokens_per_step_max"] == 8


def sweep(tmp_path, *extra):
    command = [sys.executable, "-m", "harness", "-m", "strategy=static,continuous", "concurrency=2",
               "workload=synthetic", "workload.num_requests=5", "workload.prompt.low=4", "workload.prompt.high=30",
               "workload.output.low=2", "workload.output.high=8", "workload.arrival=poisson",
               "workload.rate=20,80", "progress=false", f"hydra.sweep.dir={tmp_path}", *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_sweep_ends_in_a_comparison_survives_a_failed_job_and_resumes(tmp_path):
    result = sweep(tmp_path, "kv_cache.num_blocks=1,64")  # 1 block cannot serve 2 concurrent requests
    assert result.returncode == 0, result.stderr[-3000:]
    comparison = pd.read_csv(tmp_path / "comparison.csv")
    assert len(comparison) == 8
    assert (comparison.status == "failed").sum() == 4
    assert comparison[comparison.status == "failed"].error.str.contains("kv_cache.num_blocks=1").all()
    finished = comparison[comparison.status == "finished"]
    assert sorted(finished.strategy) == ["continuous", "continuous", "static", "static"]
    assert sorted(set(finished.rate)) == [20, 80]
    assert "Runs that did not finish" in (tmp_path / "comparison.md").read_text()
    for name in ("metrics_vs_rate.png", "padding_waste.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG
    run = next(p for p in tmp_path.iterdir() if (p / "summary.json").exists())
    hits = json.loads((run / "summary.json").read_text())["prefix_cache_hit_tokens"]
    assert {p.name for p in (run / "plots").iterdir()} == {"steps.png", "kv_cache.png", "latency_cdf.png",
                                                            "requests.png"} | ({"prefix_cache.png"} if hits else set())
    again = sweep(tmp_path, "kv_cache.num_blocks=64")
    assert again.returncode == 0 and again.stdout.count("skipped:") == 4


def test_compare_by_hand_lists_every_folder_with_its_status(tmp_path):
    for name, strategy, rate, waste in (("a", "static", 1.0, 0.5), ("b", "continuous", 1.0, 0.0),
                                        ("c", "static", 2.0, 0.4), ("d", "continuous", 2.0, 0.0)):
        (tmp_path / name).mkdir()
        summary = {"strategy": strategy, "workload": "w", "rate": rate, "concurrency": 4, "padding_waste": waste,
                   "output_throughput_tps": 10 * rate, "goodput_rps": rate, "ttft_s_p50": 0.1, "ttft_s_p99": 0.2}
        (tmp_path / name / "summary.json").write_text(pd.Series(summary).to_json())
        (tmp_path / name / "status.json").write_text('{"status": "finished"}')
    folders = {"failed": {"status.json": '{"status": "failed", "error": "boom"}'},
               # an old summary beside a later failure: the failure is what counts
               "failed-later": {"status.json": '{"status": "failed", "error": "later"}', "summary.json": '{"a": 1}'},
               "damaged-status": {"status.json": '{"stat'},
               "damaged-summary": {"status.json": '{"status": "finished"}', "summary.json": "[1, 2"},
               "died": {"status.json": '{"status": "running"}'},  # nobody holds its lock
               "empty": {}}
    for name, files in folders.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    out = tmp_path.parent / f"{tmp_path.name}-out"
    result = subprocess.run([sys.executable, "-m", "harness.analysis.compare", str(tmp_path / "*"), "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out / "comparison.csv").set_index("run")
    assert len(table) == 10 and all(name in result.stdout for name in folders)
    assert table.status.to_dict() == {"a": "finished", "b": "finished", "c": "finished", "d": "finished",
                                      "failed": "failed", "failed-later": "failed", "damaged-status": "damaged",
                                      "damaged-summary": "damaged", "died": "crashed", "empty": "no run"}
    assert np.isclose(table.loc["c", "output_throughput_tps"], 20.0)
    assert (out / "plots" / "metrics_vs_rate.png").read_bytes()[:8] == PNG
    assert "boom" in (out / "comparison.md").read_text()


def test_runs_of_one_strategy_are_told_apart_by_their_folders_with_their_prefix_hit_rates(tmp_path):
    for router, hit_rate, tps in (("round_robin", 0.47, 4600.0), ("prefix_aware", 0.82, 5500.0)):
        run = tmp_path / f"runner.router={router}"
        run.mkdir()
        write_status(run, RunStatus.FINISHED)
        write_json(run / "summary.json", {"strategy": "continuous", "workload": "conversation", "rate": 8.0,
                                          "output_throughput_tps": tps, "ttft_s_p50": 0.1,
                                          "prefix_hit_rate_tokens": hit_rate})
    runs = write_comparison(sorted(tmp_path.iterdir()), tmp_path / "out", tmp_path)
    assert sorted(runs.run) == ["runner.router=prefix_aware", "runner.router=round_robin"]
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "runner.router=prefix_aware" in text and "prefix_hit_rate_tokens" in text and "0.82" in text
    assert (tmp_path / "out" / "plots" / "systems.png").read_bytes()[:8] == PNG


def test_comparison_of_nothing_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no folders to compare"):
        write_comparison([], tmp_path / "out")


def test_a_parallel_sweep_of_simulations_with_the_joblib_launcher(tmp_path):
    result = subprocess.run([sys.executable, "-m", "harness", "-m", "hydra/launcher=joblib", "runner=sim",
                             "model=llama-2-7b", "runner.hardware=h100", "strategy=static,continuous",
                             "workload.rate=4,8", "workload.num_requests=12", "progress=false",
                             f"hydra.sweep.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    comparison = pd.read_csv(tmp_path / "comparison.csv")
    assert len(comparison) == 4 and (comparison.status == "finished").all()
    assert (tmp_path / "plots" / "metrics_vs_rate.png").read_bytes()[:8] == PNG


def test_result_files_get_the_usual_permissions(tmp_path):
    """Atomic writes must not leave files readable to their owner alone (mkstemp's 0600): results are shared."""
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]  # no temporary file left behind


@pytest.mark.parametrize("seconds,shown", [(0.00085, "850 µs"), (0.0123, "12.3 ms"), (4.567, "4.57 s"),
                                           (556.1413, "556 s"), (556141.3, "154.5 h"), (math.nan, "n/a")])
def test_durations_are_shown_in_units_a_person_reads(seconds, shown):
    assert duration(seconds) == shown
