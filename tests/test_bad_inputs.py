"""The bad-input corpus through the command line: each case ends in one clear line and a non-zero exit, before
any model is loaded when the config is at fault, or runs with its documented meaning."""

import pytest
import torch

from tests.bad_input_corpus import load_cases, run_case

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_gets_one_clear_answer(case):
    if case.get("needs") == "no-gpu" and torch.cuda.is_available():
        pytest.skip("a case about a machine without a GPU")
    result = run_case(case)
    expected = "accepted" if "accepted" in case else "clear"
    assert result["class"] == expected, (result["returncode"], result["stderr"][-1500:], result["stdout"][-800:])
