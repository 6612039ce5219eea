"""Look at a workload before running it: `python -m harness.describe workload=<name> [key=value ...]`.

Prints its statistics (count, length percentiles, arrival rate, burstiness) and saves a histogram plot.
"""

import argparse
from pathlib import Path

import pandas as pd

from harness.config import compose_config
from harness.model_spec import load_tokenizer, read_model_config
from workloads import build_workload
from workloads.describe import plot_workload, workload_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m harness")
    parser.add_argument("--out", type=Path, help="plot path (default results/workloads/<name>.png)")
    args = parser.parse_args()
    cfg = compose_config(args.overrides)
    tokenizer = load_tokenizer(cfg.model)
    workload = build_workload(cfg.workload, read_model_config(cfg.model)["vocab_size"], tokenizer)
    for key, value in workload.info.items():
        print(f"{key}: {value}")
    print(pd.Series(workload_stats(workload)).to_string(float_format=lambda x: f"{x:,.3f}"))
    out = args.out or Path("results") / "workloads" / f"{workload.name}.png"
    plot_workload(workload, out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
