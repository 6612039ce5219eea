"""The prepared GPU check: its CPU dry run end to end (so it cannot rot between GPU sessions), and its bf16 rule."""

import json
import subprocess
import sys

import torch

from harness.core.records import RunRecords
from harness.gpu_check import BF16_NEAR_TIE, _compare
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
