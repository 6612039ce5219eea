"""Whether a wall-clock measurement can be trusted: how much of the machine other work took while it ran (other
processes' CPU time and the hypervisor's steal), and how far the times of same-shaped steps spread.

On a 2-core machine a real run beside one busy process slows 5-10x and its strategies' ratios turn around, so
every run that measures wall time records these figures and says when they were not those of a quiet machine.
The thresholds were measured here (README, "Trusting a measurement"): quiet, other work took 0.1-0.3 cores
(mostly steal) and same-shaped steps spread 0.3-0.6 (p90 over the median, minus one); beside a busy loop on each
core, other work took 1.1 cores and steps spread 4.4.
"""

import os
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import psutil

# Cores of other work beyond those the run leaves free before a run counts as sharing its cores.
OTHER_CORES_TOLERANCE = 0.5
# p90 / p50 - 1 of same-shaped steps' times beyond which a run's steps were disturbed.
QUIET_STEP_SPREAD = 1.5
MIN_STEPS_PER_SHAPE = 5  # a shape seen fewer times says nothing about spread
SHAPE_COLUMNS = ["num_prefill_tokens", "num_decode_tokens", "num_padding_tokens", "num_seqs"]


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    busy_s: float  # machine-wide CPU seconds not idle, steal included
    steal_s: float  # taken by the hypervisor for other guests
    own_s: float  # this process and its children, live or reaped


def sample_cpu(extra_pids: tuple[int, ...] = ()) -> CpuSample:
    """The machine's and this process tree's CPU seconds so far; `extra_pids` (a server the run measures that it
    did not start) count as the run's own, with their children."""
    times = psutil.cpu_times()
    steal = getattr(times, "steal", 0.0)
    busy = times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0) + steal
    own = sum(os.times()[:4])  # user, system, and those of reaped children
    processes = psutil.Process().children(recursive=True)
    for pid in extra_pids:
        try:
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
    for process in processes:
        try:
            cpu = process.cpu_times()
            own += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        except psutil.Error:  # gone meanwhile: its parent has its time, or it is lost (a few ms)
            pass
    return CpuSample(time.monotonic(), busy, steal, own)


class MachineLoad:
    """Samples CPU time around a measured region (`with MachineLoad(run_cores): ...`); `figures()` then says how
    much of the machine other work took meanwhile, against the `run_cores` the run itself keeps busy."""

    def __init__(self, run_cores: int, extra_pids: tuple[int, ...] = ()):
        self.machine_cores = psutil.cpu_count() or 1
        self.run_cores = min(run_cores, self.machine_cores)
        self.extra_pids = extra_pids
        self._start = self._end = None
        self._load_avg_1m = None

    def __enter__(self) -> "MachineLoad":
        self._start = sample_cpu(self.extra_pids)
        return self

    def __exit__(self, *exc) -> None:
        self._end = sample_cpu(self.extra_pids)
        self._load_avg_1m = os.getloadavg()[0]

    @property
    def measured(self) -> bool:
        """Whether the measured region ran to its end (a run stopped before it began has no figures)."""
        return self._end is not None

    def figures(self) -> dict:
        """`machine_cores`, `run_cores`, `other_cpu_cores` (mean cores other work kept busy, steal included),
        `steal_cores` and `load_avg_1m` (at the end, the run's own threads included)."""
        start, end = self._start, self._end
        wall = max(end.wall_s - start.wall_s, 1e-9)
        other = max((end.busy_s - start.busy_s) - (end.own_s - start.own_s), 0.0)
        return {"machine_cores": self.machine_cores, "run_cores": self.run_cores, "other_cpu_cores": other / wall,
                "steal_cores": (end.steal_s - start.steal_s) / wall, "load_avg_1m": self._load_avg_1m}


def step_time_spread(steps: pd.DataFrame) -> float | None:
    """How far the wall times of steps of one shape (tokens of each kind, sequences) spread: p90 / p50 - 1 per
    shape seen at least `MIN_STEPS_PER_SHAPE` times, averaged weighted by steps; None with no such shape."""
    if steps is None or steps.empty:
        return None
    groups = steps.groupby(SHAPE_COLUMNS).duration_s
    table = pd.DataFrame({"n": groups.size(), "p50": groups.median(), "p90": groups.quantile(0.9)})
    table = table[(table.n >= MIN_STEPS_PER_SHAPE) & (table.p50 > 0)]
    if table.empty:
        return None
    return float(np.average(table.p90 / table.p50 - 1, weights=table.n))


def measurement_warning(figures: dict) -> str | None:
    """One line saying why a run's timings cannot be trusted, or None for a quiet machine."""
    problems = []
    spare = figures["machine_cores"] - figures["run_cores"]
    if figures["other_cpu_cores"] > spare + OTHER_CORES_TOLERANCE:
        problems.append(f"other work kept {figures['other_cpu_cores']:.2f} of the machine's {figures['machine_cores']} "
                        f"cores busy while the run used {figures['run_cores']}")
    spread = figures.get("step_time_spread")
    if spread is not None and spread > QUIET_STEP_SPREAD:
        problems.append(f"same-shaped steps' times spread {spread:.1f} (p90 / median - 1; at most "
                        f"{QUIET_STEP_SPREAD:g} on a quiet machine)")
    if not problems:
        return None
    return f"the machine was not quiet: {'; '.join(problems)}; timings and ratios between runs are not to be trusted"


MEASUREMENT_KEYS = ("machine_cores", "run_cores", "other_cpu_cores", "steal_cores", "load_avg_1m", "step_time_spread",
                    "measurement_warning")


def measurement(load: MachineLoad | None, steps: pd.DataFrame | None) -> dict:
    """The summary's measurement figures: the machine's load over the run and its steps' spread, with the warning
    they call for; all None for a run that measured no wall time (a simulation)."""
    if load is None or not load.measured:
        return dict.fromkeys(MEASUREMENT_KEYS)
    figures = load.figures() | {"step_time_spread": step_time_spread(steps)}
    return figures | {"measurement_warning": measurement_warning(figures)}


def machine_line(load: MachineLoad) -> str:
    """What a benchmark prints under its figures: how busy the machine was while it measured, and the verdict."""
    figures = load.figures()
    warning = measurement_warning(figures)
    return (f"machine: other work kept {figures['other_cpu_cores']:.2f} of {figures['machine_cores']} cores busy "
            f"(steal {figures['steal_cores']:.2f}) beside the {figures['run_cores']} measured; "
            + (f"warning: {warning}" if warning else "quiet"))
