"""Fit an engine profile (`conf/engine/`) to published runs of that engine on several GPUs, and report every run's
error, fitted and held out: `python -m harness.sim.fit_engine vllm-v1 --fit RUNS... --hold-out RUNS... [--write]`.

Unlike `harness.sim.calibrate`, which fits one cluster's absolute figures, this fits what belongs to the engine
across GPU classes: its kernels' share of peak FLOP/s as a scale on each hardware class's figure, its share of peak
memory bandwidth, its host costs and front end, and (given runs of a mixture of experts) its expert GEMMs' efficiency.
Each run is replayed as it was served (`setup`: GPUs, formats, async scheduling). `--write` puts the fitted figures
into the profile's file; `--markdown` prints the tables the README's grounding section shows.
"""

import argparse
from dataclasses import asdict, fields, replace
from pathlib import Path

import yaml

from harness.sim.calibrate import (
    WEIGHTS,
    error_loss,
    pinned_params,
    profile_params,
    relative_errors,
    run_architecture,
    simulate,
    two_start_search,
)
from harness.sim.calibration import BOUNDS
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.engine_profile import CATALOGUE_DIR, FITTED_FIGURES, EngineProfile, get_engine
from harness.sim.measured import MeasuredRun, load_measured_runs

# The figures a profile fit searches, and their ranges (this project's choice): calibrate's, with the compute share as
# a scale on the hardware class's (1.0: as the engine the class figure was fitted on; 1.5 puts a Hopper at 77% of its
# peak), and a scheduler's host time capped at 4 ms a step and 20 µs a sequence: uncapped, a fit of bursts alone
# traded a slower GPU for 8 ms steps and 88 µs per sequence (SGLang, measured here), which no engine takes.
PROFILE_BOUNDS = ({"compute_scale": (0.3, 1.5), "fa2_compute_scale": (0.3, 1.5)}
                  | {name: getattr(BOUNDS, name) for name in FITTED_FIGURES if "compute_scale" not in name}
                  | {"step_overhead_s": (0.0, 0.004), "seq_overhead_s": (0.0, 2e-5)})
# What a report shows of each run: the metrics a fit matches (`calibrate.WEIGHTS`) and, where the run publishes it, the
# median ITL, which no fit sees. A median ITL is the step most of a run's tokens come from (in a burst, a decode step);
# a TPOT mixes those with the prefills a request waits out, so the two can be right together by errors that cancel.
SHOWN = {"output_throughput_tps": "tput", "tpot_s_p50": "TPOT p50", "ttft_s_p50": "TTFT p50", "e2e_s_mean": "E2E",
         "itl_s_p50": "ITL p50"}


def errors(run: MeasuredRun, engine: EngineProfile, keys=SHOWN) -> dict[str, float]:
    """`run`'s relative error under `engine` in every metric of `keys` it publishes."""
    return relative_errors(run, simulate(run, profile_params(run, engine)), keys)


def loss(runs: list[MeasuredRun], engine: EngineProfile) -> float:
    return error_loss(errors(run, engine, WEIGHTS) for run in runs)


def fit_profile(runs: list[MeasuredRun], start: EngineProfile, max_evaluations: int) -> tuple[EngineProfile, float]:
    """The profile that best reproduces `runs` from `start`: `calibrate.fit`'s search (from `start` and from its
    screened variant, each restarted once from its own answer) of the figures the runs pin (`pinned_params`). One
    search alone stopped where it began on the `vllm-v1` runs (a loss of 0.0327); restarted, it went on to 0.0309.
    The figures `start` holds (`EngineProfile.held`: measured elsewhere) stay as they are."""
    pinned = pinned_params(runs) | {"compute_scale"}  # a profile's compute figure: a scale on the hardware class's
    if start.fa2_compute_scale is not None and any(get_hardware(run.hardware).attention_query_tile for run in runs):
        pinned.add("fa2_compute_scale")  # and its own on the GPUs without FlashAttention-3, where the runs have one
    bounds = {name: limits for name, limits in PROFILE_BOUNDS.items() if name in pinned and name not in start.held}
    return two_start_search(start, bounds, lambda engine: loss(runs, engine), max_evaluations)


def error_rows(runs: list[MeasuredRun], engine: EngineProfile, role: str) -> list[dict]:
    rows = []
    for run in runs:
        arch = run_architecture(run)
        rows.append({"run": run.name, "role": role, "kind": "MoE" if arch.num_experts else "dense",
                     "source": run.source, **errors(run, engine)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| run | role | model | " + " | ".join(SHOWN.values()) + " |", "|---" * (3 + len(SHOWN)) + "|"]
    for row in rows:
        cells = [f"{row[key]:+.1%}" if isinstance(row.get(key), float) else "" for key in SHOWN]
        link = f"[{row['run']}]({row['source'].split()[0]})"
        lines.append(f"| {link} | {row['role']} | {row['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def as_written(engine: EngineProfile) -> EngineProfile:
    """The profile as its file holds it, each figure to 4 significant digits: the errors recorded beside the figures
    must be those the file's figures give (`tests/test_formats_and_engines.py` recomputes them to 6e-5)."""
    return replace(engine, **{f.name: float(f"{value:.4g}") for f in fields(engine)
                              if isinstance(value := getattr(engine, f.name), float)})


def write_profile(name: str, engine: EngineProfile, fitted: list[MeasuredRun], rows: list[dict]) -> Path:
    """The fitted figures and every run's error (`rows`) into `conf/engine/<name>.yaml`, its comments and description
    kept."""
    path = CATALOGUE_DIR / f"{name}.yaml"
    text = path.read_text()
    comments = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    # What it holds stays as the file says it, with each figure's source.
    figures = {f.name: value for f in fields(EngineProfile)
               if f.name not in ("name", "held") and (value := getattr(engine, f.name)) is not None}
    data |= figures
    data["fitted_on"] = [run.name for run in fitted]
    data["errors"] = {row["run"]: {"role": row["role"]} | {key: round(row[key], 4) for key in SHOWN if key in row}
                      for row in rows}
    path.write_text(comments + yaml.safe_dump(data, sort_keys=False, width=118))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", help="a profile of conf/engine/ (the start of the fit)")
    parser.add_argument("--fit", nargs="+", required=True, help="published runs of that engine to fit")
    parser.add_argument("--hold-out", nargs="*", default=[], help="runs to predict, not fitted")
    parser.add_argument("--evaluations", type=int, default=300)
    parser.add_argument("--write", action="store_true", help="write the fitted figures into the profile's file")
    parser.add_argument("--markdown", action="store_true", help="print the error tables as markdown")
    args = parser.parse_args()
    fitted, held_out = load_measured_runs(args.fit), load_measured_runs(args.hold_out) if args.hold_out else []
    start = get_engine(args.engine)
    engine, value = fit_profile(fitted, start, args.evaluations) if args.evaluations else (start, loss(fitted, start))
    engine = as_written(engine)
    print(f"loss {value:.4f}; figures: " + ", ".join(f"{k}={v:.4g}" for k, v in asdict(engine).items()
                                                  if isinstance(v, float)))
    rows = error_rows(fitted, engine, "fitted") + error_rows(held_out, engine, "held out")
    if args.markdown:
        print(markdown(rows))
    else:
        for row in rows:
            print(f"{row['role']:8s} {row['kind']:5s} {row['run']:58s} " + " ".join(
                f"{label}={row[key]:+.1%}" for key, label in SHOWN.items() if key in row))
    if args.write:
        print(f"profile: {write_profile(args.engine, engine, fitted, rows)}")


if __name__ == "__main__":
    main()
