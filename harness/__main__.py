"""`python -m harness strategy=... workload=...`: one run (or, with -m, a Hydra sweep of runs)."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.config import ConfigError
from harness.job import run_job
from harness.results import write_json
from workloads import WorkloadError


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_job(cfg, run_dir)
    except (ConfigError, WorkloadError) as e:
        write_json(run_dir / "status.json", {"status": "failed", "error": str(e)})
        sys.exit(f"error: {e}")
    write_json(run_dir / "status.json", {"status": "finished"})


if __name__ == "__main__":
    main()
