"""How far the simulator is from the real runner: `python -m harness.sim.fidelity [--profile CSV] [--quick]`.

For each strategy and arrival pattern it runs a workload on the real runner (twice, for the run-to-run spread of
this machine), then simulates the same workload with a profile calibrated here (made first if none is given),
and reports each metric's relative error beside the real runs' own spread. The workload is not one the profile
was built from: the profile measures synthetic grid steps, the check replays ShareGPT-like requests.

`--measured PATH...` checks the simulator against runs measured elsewhere instead (vllm bench JSONs with a setup
block, this harness's run folders — `runner=openai` against your server — with `--setup hardware=...`, or folders
of either: `tests/fixtures/published/`, your cluster's): each run's workload is simulated with the defaults (or
`--calibration` YAML from `harness.sim.calibrate`) and every metric is reported predicted beside measured, with a
plot.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.analysis.plots import save_figure
from harness.analysis.results import write_csv, write_text

METRICS = {"output_throughput_tps": "output throughput", "makespan_s": "makespan", "ttft_s_p50": "TTFT p50",
           "ttft_s_p90": "TTFT p90", "tpot_s_p50": "TPOT p50"}
WORKLOAD = ["workload=sharegpt", "workload.seed=1", "workload.num_requests=32", "workload.max_output_len=256",
            "progress=false"]
ARRIVALS = {"offline": ["workload.arrival=offline"], "poisson": ["workload.arrival=poisson", "workload.rate=2"]}
QUICK = ["workload.num_requests=6", "workload.max_output_len=12", "concurrency=4"]


def run(overrides: list[str], run_dir: Path) -> dict:
    """One whole run, as a user would start it; its summary."""
    subprocess.run([sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={run_dir}"], check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads((run_dir / "summary.json").read_text())


def fidelity_table(rows: list[dict]) -> pd.DataFrame:
    """Per strategy, arrival and metric: the real mean, the spread between real runs, the simulated value, and
    the simulation's relative error against the real mean."""
    records = []
    for row in rows:
        for key, name in METRICS.items():
            reals = [summary[key] for summary in row["real"]]
            mean = sum(reals) / len(reals)
            records.append({
                "strategy": row["strategy"], "arrival": row["arrival"], "metric": name, "real": mean,
                "real_spread": (max(reals) - min(reals)) / mean if mean else float("nan"),
                "simulated": row["sim"][key], "error": (row["sim"][key] - mean) / mean if mean else float("nan"),
            })
    return pd.DataFrame(records)


def plot_errors(table: pd.DataFrame, path: Path) -> None:
    arrivals = sorted(table.arrival.unique())
    fig, axes = plt.subplots(1, len(arrivals), figsize=(6 * len(arrivals), 3.8), sharey=True, squeeze=False)
    for ax, arrival in zip(axes[0], arrivals):
        part = table[table.arrival == arrival]
        errors = part.pivot(index="metric", columns="strategy", values="error").reindex(list(METRICS.values()))
        (100 * errors).plot.bar(ax=ax, rot=20)
        spread = part.groupby("metric").real_spread.max().reindex(errors.index)
        ax.scatter(range(len(spread)), 100 * spread, marker="_", s=400, color="k", zorder=3,
                   label="real run-to-run spread")
        ax.axhspan(-10, 10, color="tab:green", alpha=0.08)
        ax.set(title=f"{arrival} arrivals", ylabel="simulated vs real (%)", xlabel="")
        ax.axhline(0, color="k", lw=0.8)
        ax.get_legend().remove()
    axes[0][-1].legend(*axes[0][-1].get_legend_handles_labels(), fontsize=8, loc="upper left",
                       bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Simulator error per metric (shaded: the 10% target)", fontsize=11)
    save_figure(fig, path)


def measured_fidelity(paths: list[str], calibration: Path | None, out: Path,
                      setup: dict | None = None) -> pd.DataFrame:
    """Per measured run and metric: measured, predicted, relative error; written as a table and a plot."""
    from harness.sim.calibrate import default_params, simulate
    from harness.sim.calibration import RooflineParams, load_calibration
    from harness.sim.measured import load_measured_runs

    runs = load_measured_runs(paths, setup)
    rows = []
    for run in runs:
        params = RooflineParams(**load_calibration(calibration)) if calibration else default_params(run)
        predicted = simulate(run, params)
        rows += [{"run": run.name, "metric": metric, "measured": measured, "predicted": predicted[metric],
                  "error": (predicted[metric] - measured) / measured} for metric, measured in run.metrics.items()]
    table = pd.DataFrame(rows)
    write_csv(out / "fidelity_measured.csv", table)
    metrics = list(table.metric.unique())
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        part = table[table.metric == metric]
        ax.scatter(part.measured, part.predicted)
        low, high = min(part.measured.min(), part.predicted.min()), max(part.measured.max(), part.predicted.max())
        line = [low * 0.8, high * 1.25]
        ax.plot(line, line, color="k", lw=0.8)
        ax.fill_between(line, [x * 0.85 for x in line], [x * 1.15 for x in line], color="tab:green", alpha=0.1)
        ax.set(xscale="log", yscale="log", title=metric, xlabel="measured", ylabel="predicted")
    fig.suptitle("Simulator against measured runs (shaded: within 15%)", fontsize=11)
    save_figure(fig, out / "fidelity_measured.png")
    text = table.assign(error=table.error.map("{:+.1%}".format)).to_markdown(index=False, floatfmt=".4g")
    write_text(out / "fidelity_measured.md", f"# Simulator against measured runs\n\n{text}\n\n"
                                             "![predicted vs measured](fidelity_measured.png)\n")
    print(text)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", nargs="+", help="measured runs (vllm bench JSONs, run folders, or folders of "
                                                      "either) instead of real runs here")
    parser.add_argument("--setup", nargs="*", default=[], metavar="KEY=VALUE",
                        help="with --measured: what run folders do not say (hardware=h100 model=llama-3.1-8b ...)")
    parser.add_argument("--calibration", type=Path, help="with --measured: a calibration YAML instead of defaults")
    parser.add_argument("--profile", type=Path, help="a profile CSV; default: make one first")
    parser.add_argument("--out", type=Path, default=Path("results") / "fidelity" / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--repeats", type=int, default=2, help="real runs per case, for the spread")
    parser.add_argument("--quick", action="store_true", help="tiny workloads and profile: a smoke test")
    args = parser.parse_args()
    if args.measured:
        from harness.sim.calibrate import parse_setup

        measured_fidelity(args.measured, args.calibration, args.out, parse_setup(args.setup))
        print(f"fidelity: {args.out / 'fidelity_measured.md'}")
        return
    profile = args.profile
    if profile is None:
        profile = args.out / "profile.csv"
        subprocess.run([sys.executable, "-m", "harness.sim.step_profile", "--out", str(profile)]
                       + (["--quick"] if args.quick else []), check=True)
    rows = []
    for arrival, arrival_overrides in ARRIVALS.items():
        for strategy in ("static", "dynamic", "continuous"):
            base = [f"strategy={strategy}", *WORKLOAD, *arrival_overrides, *(QUICK if args.quick else [])]
            real = [run(base, args.out / "runs" / f"{strategy}_{arrival}_real{i}") for i in range(args.repeats)]
            sim = run([*base, "runner=sim", f"runner.profile={profile.resolve()}"],
                      args.out / "runs" / f"{strategy}_{arrival}_sim")
            rows.append({"strategy": strategy, "arrival": arrival, "real": real, "sim": sim})
    table = fidelity_table(rows)
    write_csv(args.out / "fidelity.csv", table)
    plot_errors(table, args.out / "fidelity.png")
    shown = table.assign(real_spread=table.real_spread.map("{:.1%}".format), error=table.error.map("{:+.1%}".format))
    text = shown.to_markdown(index=False, floatfmt=".4g")
    write_text(args.out / "fidelity.md", f"# Simulator fidelity\n\nprofile: {profile}\n\n{text}\n\n"
                                         "![errors](fidelity.png)\n")
    print(text)
    worst = table.error.abs().max()
    print(f"worst error {worst:.1%}; within 10% on {(table.error.abs() <= 0.10).mean():.0%} of the metrics")
    print(f"fidelity: {args.out / 'fidelity.md'}")


if __name__ == "__main__":
    main()
