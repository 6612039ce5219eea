"""Look at a workload before running it: `python -m harness.describe workload=<name> [key=value ...]`.

Prints its statistics (count, length percentiles, arrival rate, burstiness) and saves a histogram plot.
"""

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.config import ConfigError, compose_config, validate
from harness.model_spec import load_tokenizer, read_model_config
from workloads import WorkloadError, build_workload
from workloads.describe import plot_workload, workload_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m harness")
    parser.add_argument("--out", type=Path, help="plot path (default results/workloads/<name>.png)")
    args = parser.parse_args()
    try:
        cfg = validate(compose_config(args.overrides))
        model = read_model_config(cfg.model)
        workload = build_workload(cfg.workload, model["vocab_size"], load_tokenizer(cfg.model),
                                  model["max_position_embeddings"])
    except (ConfigError, WorkloadError) as e:
        sys.exit(f"error: {e}")
    for key, value in workload.info.items():
        print(f"{key}: {value}")
    print(pd.Series(workload_stats(workload)).to_string(float_format=lambda x: f"{x:,.3f}"))
    out = args.out or Path("results") / "workloads" / f"{workload.name}.png"
    plot_workload(workload, out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
