"""Compare runs: one table and one set of plots across run folders — at the end of every multirun (a Hydra
callback), or by hand: `python -m harness.analysis.compare results/sweeps/<time>/* [--out DIR]`."""

import argparse
import glob
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.experimental.callback import Callback

if TYPE_CHECKING:
    import pandas as pd

from harness.analysis.results import (
    RunStatus,
    find_run_folders,
    folder_in_use,
    read_status,
    write_csv,
    write_text,
)

COLUMNS = ["status", "strategy", "workload", "arrival", "rate", "concurrency", "num_gpus", "num_finished",
           "num_rejected",
           "num_preemptions", "request_throughput_rps", "output_throughput_tps", "goodput_rps", "ttft_s_p50",
           "ttft_s_p99", "tpot_s_p50", "tpot_s_p99", "e2e_s_p50", "padding_waste", "kv_peak_utilization",
           "prefix_hit_rate_tokens", "makespan_s", "error"]
SWEEP_AXES = ("rate", "concurrency")  # the first that varies across runs becomes the x axis


def load_runs(run_dirs: list[Path], base: Path | None = None) -> "pd.DataFrame":
    """One row per folder given, whatever state it is in: a finished run's summary; an interrupted run's partial
    summary; a failed run's error; a folder whose files are damaged, whose run died without a status, or that is
    no run folder at all and holds none, said so. `status.json` is the truth: a summary left by an earlier run never
    counts. A run is named by its path from `base` (by its own name without one)."""
    rows = []
    for run_dir in run_dirs:
        status = read_status(run_dir)
        state = status.get("status")
        if state is None:
            row = {"status": "no run", "error": "no status.json in it or below it: not a run folder"}
        elif state == RunStatus.RUNNING and not folder_in_use(run_dir):
            row = status | {"status": "crashed", "error": "the run ended without writing its status (killed?)"}
        elif state in (RunStatus.FINISHED, RunStatus.INTERRUPTED):
            summary = _read_summary(run_dir / "summary.json")
            row = status | ({"status": "damaged", "error": "summary.json is missing or unreadable"}
                            if summary is None else summary | {"status": state})
        else:
            row = status
        name = run_dir.relative_to(base).as_posix() if base is not None and run_dir != base else run_dir.name
        rows.append(row | {"run": name})
    import pandas as pd  # here, not at the top: every run loads this module (the sweep callback)

    table = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in table:
            table[column] = None
    return table


def _read_summary(path: Path) -> dict | None:
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def sweep_axis(runs: "pd.DataFrame") -> str | None:
    finished = runs[runs.status == RunStatus.FINISHED]
    return next((axis for axis in SWEEP_AXES if finished[axis].nunique(dropna=True) > 1), None)


def _slo_text(runs: "pd.DataFrame") -> str:
    limits = [f"{name} <= {runs[key].iloc[0]:g} s" for key, name in (("slo_ttft_s", "TTFT"), ("slo_tpot_s", "TPOT"))
              if key in runs and runs[key].notna().any()]
    return ", ".join(limits) if limits else "no SLO set"


def plot_comparison(runs: "pd.DataFrame", plots_dir: Path) -> list[Path]:
    # Imported where drawn: every run loads this module (the sweep callback), and pyplot takes 0.6 s.
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    from harness.analysis.plots import save_figure

    finished = runs[runs.status == RunStatus.FINISHED]
    if finished.empty:
        return []
    axis = sweep_axis(runs)
    paths = []
    if axis:
        label = {"rate": "request rate (req/s)", "concurrency": "max concurrent requests"}[axis]
        panels = [("output_throughput_tps", "output throughput (tok/s)", False),
                  ("goodput_rps", f"goodput (req/s meeting {_slo_text(finished)})", False),
                  ("ttft_s_p50", "TTFT p50 (s)", True), ("ttft_s_p99", "TTFT p99 (s)", True)]
        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        for ax, (metric, title, log) in zip(axes.flat, panels):
            for strategy, group in finished.sort_values(axis).groupby("strategy"):
                ax.plot(group[axis], group[metric], marker="o", label=strategy)
            ax.set(title=title, xlabel=label)
            if log:
                ax.set_yscale("log")
            if finished[axis].max() >= 4 * finished[axis].min() > 0:
                ax.set_xscale("log", base=2)  # sweeps double their load: equal steps on the axis
                ax.set_xticks(sorted(finished[axis].unique()))
                ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.grid(alpha=0.3)
        axes.flat[0].legend()
        fig.suptitle(f"Strategies against {label}", fontsize=11)
        paths.append(plots_dir / f"metrics_vs_{axis}.png")
        save_figure(fig, paths[-1])
    else:
        paths.append(plot_systems(finished, plots_dir / "systems.png"))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # A peer reports no padding: it has no bar rather than a made-up zero.
    waste = finished.dropna(subset=["padding_waste"]).groupby("strategy").padding_waste.mean().sort_values()
    ax.barh(waste.index, 100 * waste.to_numpy(), color="tab:red")
    ax.set(title="Padding waste (mean over runs)", xlabel="share of computed token slots (%)", xlim=(0, 100))
    for y, value in enumerate(waste.to_numpy()):
        ax.text(100 * value + 1, y, f"{value:.1%}", va="center")
    paths.append(plots_dir / "padding_waste.png")
    save_figure(fig, paths[-1])
    return paths


def plot_systems(finished: "pd.DataFrame", path: Path) -> Path:
    """One load, several systems (ours and peers) or several settings of one (routers, caches): output throughput,
    TTFT p50 and, where a prefix cache found something, its hit rate, side by side. Bars are named by strategy, or
    by run where one strategy ran several times."""
    import matplotlib.pyplot as plt

    from harness.analysis.plots import save_figure

    label = "strategy" if finished.strategy.is_unique else "run"
    panels = [("output_throughput_tps", "output throughput (tok/s), higher is better", "{:.0f}", "tab:blue"),
              ("ttft_s_p50", "TTFT p50 (s), lower is better", "{:.3g}", "tab:orange")]
    if (finished.prefix_hit_rate_tokens.astype(float).fillna(0) > 0).any():
        panels.append(("prefix_hit_rate_tokens", "prefix hit rate (prompt tokens)", "{:.1%}", "tab:olive"))
    columns = [column for column, *_ in panels]
    systems = finished.groupby(label)[columns].mean().sort_values("output_throughput_tps")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 0.5 * len(systems) + 1.5), sharey=True)
    for ax, (column, title, fmt, color) in zip(axes, panels):
        ax.barh(systems.index, systems[column], color=color)
        ax.set(title=title)
        for y, value in enumerate(systems[column]):
            ax.text(value, y, " " + fmt.format(value), va="center")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Systems on one workload", fontsize=11)
    save_figure(fig, path)
    return path


def comparison_markdown(runs: "pd.DataFrame", plots: list[Path], out_dir: Path) -> str:
    shown = runs[["run", *COLUMNS]].drop(columns="error")
    failed = runs[runs.status != RunStatus.FINISHED]
    parts = ["# Comparison", "", f"{len(runs)} runs, {len(failed)} not finished.", "",
             shown.to_markdown(index=False, floatfmt=".4g"), ""]
    if len(failed):
        parts += ["## Runs that did not finish", "",
                  *[f"- {row.run}: {row.status}: {row.error}" for row in failed.itertuples()], ""]
    parts += [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots]
    return "\n".join(parts) + "\n"


def write_comparison(run_dirs: list[Path], out_dir: Path, base: Path | None = None) -> "pd.DataFrame":
    runs = load_runs(run_dirs, base)
    if runs.empty:
        raise SystemExit("no folders to compare")
    sort = [c for c in ("strategy", "rate", "concurrency") if runs[c].notna().any()]
    runs = runs.sort_values(sort, na_position="last").reset_index(drop=True)
    write_csv(out_dir / "comparison.csv", runs[["run", *COLUMNS]])
    plots = plot_comparison(runs, out_dir / "plots")
    write_text(out_dir / "comparison.md", comparison_markdown(runs, plots, out_dir))
    return runs


def print_comparison(runs: "pd.DataFrame", out_dir: Path) -> None:
    shown = ["run", "status", "strategy", "workload", "rate", "concurrency", "output_throughput_tps", "ttft_s_p50",
             "padding_waste"]
    print(runs[shown].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"comparison: {out_dir / 'comparison.md'}")


class ComparisonCallback(Callback):
    """Writes the comparison into the sweep folder when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = find_run_folders(sweep_dir)
        if not jobs:
            raise SystemExit(f"no run folders in {sweep_dir}: every job failed before it began?")
        print_comparison(write_comparison(jobs, sweep_dir, sweep_dir), sweep_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders or glob patterns")
    parser.add_argument("--out", type=Path, default=Path("results") / "comparison", help="where to write")
    args = parser.parse_args()
    given = sorted({Path(p) for pattern in args.runs for p in (glob.glob(pattern) or [pattern])})
    missing = [str(p) for p in given if not p.is_dir()]
    if missing:
        raise SystemExit(f"error: not a folder: {', '.join(missing)}")
    found = {folder: find_run_folders(folder) for folder in given}
    if not any(found.values()):
        raise SystemExit(f"error: no run folder in {', '.join(map(str, given))}, at any depth (a run folder has a "
                         "status.json or a summary.json)")
    # A folder holding no run at any depth stays in the table as one, said so; every other gives its runs.
    run_dirs = sorted({run for folder, runs in found.items() for run in (runs or [folder])})
    base = Path(os.path.commonpath(run_dirs)) if len(run_dirs) > 1 else None
    print_comparison(write_comparison(run_dirs, args.out, base), args.out)


if __name__ == "__main__":
    main()
