"""Runs that say when their numbers cannot be trusted: a real run beside a deliberate CPU hog says so in its
summary, report and terminal; a quiet one does not; a simulation, which measures no wall time, says nothing."""

import contextlib
import json
import subprocess
import sys
import time
from contextlib import contextmanager

import pandas as pd
import psutil
import pytest

from harness.machine_load import (
    MEASUREMENT_KEYS,
    MIN_STEPS_PER_SHAPE,
    OTHER_CORES_TOLERANCE,
    QUIET_STEP_SPREAD,
    MachineLoad,
    measurement,
    measurement_warning,
    step_time_spread,
)
from tests.conftest import ROOT

# They read the machine's CPU time: beside another test worker every run would be busy.
pytestmark = pytest.mark.alone

# A small real run: 6 requests decoding together give a score of steps of one shape.
SMALL_REAL_RUN = ["workload=synthetic", "workload.num_requests=6", "workload.prompt={dist: fixed, value: 16}",
                  "workload.output={dist: fixed, value: 24}", "progress=false"]


def steps_of(durations: dict[tuple, list[float]]) -> pd.DataFrame:
    rows = [dict(zip(["num_prefill_tokens", "num_decode_tokens", "num_padding_tokens", "num_seqs"], shape),
                 duration_s=d) for shape, times in durations.items() for d in times]
    return pd.DataFrame(rows)


def test_the_spread_is_that_of_same_shaped_steps_weighted_by_how_often_each_shape_ran():
    steady = [0.010] * 9 + [0.012]  # p90 at rank 8.1 of 0..9: 0.0100 + 0.1 * 0.002
    noisy = [0.010] * 4 + [0.050]  # p90 at rank 3.6 of 0..4: 0.010 + 0.6 * 0.040
    rare = [0.001, 1.0]  # seen too rarely to say anything
    spread = step_time_spread(steps_of({(0, 8, 0, 8): steady, (0, 4, 0, 4): noisy, (16, 0, 0, 1): rare}))
    assert spread == pytest.approx((10 * (0.0102 / 0.010 - 1) + 5 * (0.034 / 0.010 - 1)) / 15)
    assert step_time_spread(steps_of({(0, 1, 0, 1): rare})) is None and step_time_spread(pd.DataFrame()) is None
    assert MIN_STEPS_PER_SHAPE == 5


@pytest.mark.parametrize("other,spread,warned", [
    (0.2, 0.3, None), (OTHER_CORES_TOLERANCE + 0.1, 0.3, "other work kept 0.60 of the machine's 2 cores busy"),
    (0.1, QUIET_STEP_SPREAD + 1, "same-shaped steps' times spread 2.5"), (0.1, None, None)])
def test_a_warning_names_what_was_not_quiet(other, spread, warned):
    figures = {"machine_cores": 2, "run_cores": 2, "other_cpu_cores": other, "step_time_spread": spread}
    warning = measurement_warning(figures)
    assert warning is None if warned is None else warned in warning
    # Cores the run leaves free may be busy without disturbing it.
    assert measurement_warning(figures | {"run_cores": 1, "step_time_spread": None, "other_cpu_cores": 1.2}) is None


def test_the_run_tree_counts_as_its_own_and_a_busy_sibling_as_other_work():
    with MachineLoad(run_cores=1) as own:
        subprocess.run([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1: pass"])
    with hog(1), MachineLoad(run_cores=1) as beside:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1)"])
    assert own.figures()["other_cpu_cores"] < 0.5  # its child's second of CPU was the run's
    assert beside.figures()["other_cpu_cores"] > 0.7  # the hog's, while the run's own child slept


def test_a_run_stopped_before_its_measured_part_has_no_figures():
    figures = measurement(MachineLoad(run_cores=1), None)  # never entered: stopped while a server started
    assert set(figures) == set(MEASUREMENT_KEYS) and all(value is None for value in figures.values())


@contextmanager
def hog(processes: int):
    """Busy loops that are no descendants of this process (started through a parent that exits at once, as a
    daemon is), so they are other work to any run here; killed however the test ends."""
    start = ("import subprocess, sys\n"
             f"for _ in range({processes}):\n"
             "    print(subprocess.Popen([sys.executable, '-c', 'while True: pass'], stdout=subprocess.DEVNULL,\n"
             "                           stderr=subprocess.DEVNULL).pid)")
    pids = [int(pid) for pid in subprocess.run([sys.executable, "-c", start], capture_output=True, text=True,
                                               check=True, timeout=60).stdout.split()]
    try:
        yield
    finally:
        processes = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                processes.append(psutil.Process(pid))
                processes[-1].kill()
        psutil.wait_procs(processes, timeout=10)


def wait_until_quiet(timeout_s: float = 30.0) -> None:
    """Until the machine's cores are at most a quarter busy over half a second (what the test before left running,
    a neighbour's burst, has passed), or `timeout_s`: a quiet run is only quiet on a quiet machine."""
    deadline = time.monotonic() + timeout_s
    while psutil.cpu_percent(interval=0.5) > 25 and time.monotonic() < deadline:
        pass


def real_run(tmp_path, name: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    done = subprocess.run([sys.executable, "-m", "harness", *SMALL_REAL_RUN, f"hydra.run.dir={tmp_path / name}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    return done, summary, (tmp_path / name / "report.md").read_text()


def test_a_real_run_beside_a_cpu_hog_says_so_and_a_quiet_one_does_not(tmp_path):
    with hog(psutil.cpu_count()):
        done, summary, report = real_run(tmp_path, "beside-a-hog")
    assert summary["other_cpu_cores"] > summary["machine_cores"] - summary["run_cores"] + OTHER_CORES_TOLERANCE
    assert "the machine was not quiet" in summary["measurement_warning"]
    assert "warning: the machine was not quiet" in done.stderr
    assert "> **Warning**: the machine was not quiet" in report and "## Measurement" in report

    # On a shared machine a neighbour's burst can spoil one quiet run: the verdict must be clean in one of three.
    for attempt in range(3):
        wait_until_quiet()
        done, summary, report = real_run(tmp_path, f"quiet-{attempt}")
        if summary["measurement_warning"] is None:
            break
    assert summary["measurement_warning"] is None, summary["measurement_warning"]
    assert summary["other_cpu_cores"] < OTHER_CORES_TOLERANCE and summary["step_time_spread"] < QUIET_STEP_SPREAD
    assert "warning" not in done.stderr and "a quiet machine: the timings stand" in report


def test_a_simulation_measures_no_wall_time_and_says_nothing_of_the_machine(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "runner=sim", "model=llama-2-7b", "runner.hardware=h100",
                           "workload.num_requests=8", "progress=false", f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["machine_cores"] is None and summary["measurement_warning"] is None
    assert "## Measurement" not in (tmp_path / "report.md").read_text()
