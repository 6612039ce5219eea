"""The prepared GPU check: its CPU dry run end to end (so it cannot rot between GPU sessions), and its bf16 rule."""

import json
import subprocess
import sys

import pytest
import torch

from harness.core.records import RunRecords
from harness.dense_gemms import decode_fits, stream_and_fixed_time
from harness.gpu_check import BF16_NEAR_TIE, _compare, _markdown
from strategies import Request
from tests.conftest import ROOT


def test_the_dry_run_checks_every_section_and_passes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "harness.gpu_check", "--dry-run", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kernels"]["passed"]
    assert {row["strategy"] for row in summary["oracle"]} == {"static", "dynamic", "continuous"}
    assert all(row["passed"] and row["requests_equal"] == 4 for row in summary["oracle"])
    assert "torch reference" in summary["kernel_bench"]
    gemms = summary["dense_gemms"]
    assert [(row["format"], row["tokens"]) for row in gemms["step"]] == [("bf16", 16), ("bf16", 64), ("fp8", 16),
                                                                         ("fp8", 64)]
    assert all(row["measured_ms"] > 0 and row["roofline_ms"] > 0 for row in gemms["step"])
    assert [row["matrix"] for row in gemms["streaming"]] == ["qkv", "o", "gate_up", "down", "lm_head", "qkv", "o",
                                                             "gate_up", "down"]
    assert gemms["decode_fit"] == []  # one model: no fit of a stream rate and a fixed time
    assert set(summary["seconds"]) == {"kernels", "oracle", "kernel_bench", "dense_gemms", "strategies"}
    rows = summary["strategies"]
    assert [row["strategy"] for row in rows] == ["static", "dynamic", "continuous"]
    assert all(row["output_tok_s"] > 0 and row["sim_output_tok_s"] > 0 and row["busy_s"] > 0 for row in rows)
    assert "## Strategies, real beside simulated" in (tmp_path / "summary.md").read_text()


def one_request(output_ids: list[int]) -> RunRecords:
    request = Request(request_id=0, arrival_s=0.0, token_ids=[1, 2, *output_ids], num_prompt_tokens=2,
                      max_new_tokens=len(output_ids), num_output_tokens=len(output_ids))
    return RunRecords(requests=[request])


def test_bf16_allows_a_different_token_only_at_a_near_tie():
    reference = torch.zeros(2, 4)
    reference[0, 1], reference[0, 2] = 10.0, 10.0 - 10.0 * BF16_NEAR_TIE / 2  # tokens 1 and 2 nearly tied
    reference[1, 3] = 10.0
    expected = {0: ([1, 3], reference)}
    ours = {0: [reference[0], reference[1]]}
    tie = _compare("continuous", "bfloat16", one_request([2, 0]), ours, expected, exact=False)
    assert tie["near_ties"] == 1 and tie["mismatches"] == 0 and tie["passed"]
    wrong = _compare("continuous", "bfloat16", one_request([1, 0]), ours, expected, exact=False)
    assert wrong["mismatches"] == 1 and not wrong["passed"]  # token 0 at step 2 was far from the top
    assert not _compare("continuous", "float32", one_request([2, 3]), ours, expected, exact=True)["passed"]


def test_decode_steps_of_several_models_give_one_stream_rate_and_a_fixed_time_per_gemm():
    # The H200's (2026-12-04, conf/hardware/h200.yaml): seven models' BF16 decode steps of 16 rows, (weight bytes,
    # GEMMs, seconds), from Qwen3-0.6B to Llama-3.1-70B.
    steps = [(1.192e9, 113, 0.7291e-3), (2.471e9, 65, 0.8434e-3), (15.136e9, 145, 4.224e-3), (15.009e9, 129, 4.106e-3),
             (27.980e9, 161, 7.453e-3), (63.967e9, 257, 16.84e-3), (139.003e9, 321, 34.38e-3)]
    rate, per_gemm = stream_and_fixed_time(steps)
    assert rate == pytest.approx(4.13e12, rel=0.01) and per_gemm == pytest.approx(3.9e-6, rel=0.02)
    # Fitted on each step's share of its time, the 0.6B's step is met as closely as the 70B's.
    assert all(abs(b / rate + n * per_gemm - t) < 0.022 * t for b, n, t in steps)
    exact = [(b, n, b / 3e12 + n * 5e-6) for b, n in ((1e9, 100), (4e9, 150), (20e9, 400))]
    assert stream_and_fixed_time(exact) == pytest.approx((3e12, 5e-6))
    rows = [{"format": f, "tokens": t, "weight_bytes": b, "num_gemms": n, "measured_ms": 1e3 * (b / 3e12 + n * 5e-6)}
            for f in ("bf16", "fp8") for t in (16, 64) for b, n in ((1e9, 100), (20e9, 400))]
    fits = decode_fits(rows, bandwidth=4e12)
    assert [(fit["format"], fit["tokens"], fit["models"]) for fit in fits] == [("bf16", 16, 2), ("fp8", 16, 2)]
    assert fits[0]["stream_tb_s"] == pytest.approx(3.0) and fits[0]["share_of_datasheet"] == pytest.approx(0.75)
    assert fits[0]["per_gemm_us"] == pytest.approx(5.0)
    assert decode_fits(rows[:1], bandwidth=4e12) == []
    summary = {"device": "a GPU", "torch": "2.11", "hardware_entry": "h200", "seconds": {},
               "dense_gemms": {"step": rows, "streaming": [], "decode_fit": fits}}
    assert "```yaml\nstream_bandwidth_gbps: 3000\ngemm_fixed_us: 5.0\n```" in _markdown(summary)
