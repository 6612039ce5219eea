"""The bad-input corpus through the command line: each case ends in one clear line and a non-zero exit, before
any model is loaded when the config is at fault, or runs with its documented meaning.

The cases are independent processes in their own scratch folders, so they run side by side, one per core: each
is mostly interpreter start-up, and the corpus is the longest part of the suite."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.bad_input_corpus import load_cases, run_case

CASES = load_cases()


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    runnable = [c for c in CASES if not (c.get("needs") == "no-gpu" and torch.cuda.is_available())]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip([c["id"] for c in runnable], pool.map(run_case, runnable)))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_gets_one_clear_answer(case, answers):
    if case["id"] not in answers:
        pytest.skip("a case about a machine without a GPU")
    result = answers[case["id"]]
    expected = "accepted" if "accepted" in case else "clear"
    assert result["class"] == expected, (result["returncode"], result["stderr"][-1500:], result["stdout"][-800:])
