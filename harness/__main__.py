"""`python -m harness strategy=... workload=...`: one run, or with -m a Hydra sweep of runs and a comparison."""

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.analysis.results import RunStatus, write_json
from harness.config import ConfigError
from harness.job import run_job
from workloads import WorkloadError

log = logging.getLogger("harness")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    if in_sweep and (run_dir / "summary.json").exists() and not cfg.overwrite:
        print(f"skipped: {run_dir} already has its results (overwrite=true runs it again)")
        return
    labels = {"strategy": cfg.strategy.name, "workload": cfg.workload.name, "rate": cfg.workload.get("rate"),
              "concurrency": cfg.get("concurrency")}  # so a failed job still has its place in a comparison
    try:
        run_job(cfg, run_dir)
    except (ConfigError, WorkloadError) as e:
        write_json(run_dir / "status.json", {"status": RunStatus.FAILED, "error": str(e)} | labels)
        if not in_sweep:
            sys.exit(f"error: {e}")
        log.error("%s", e)
        return
    except Exception as e:
        # In a sweep one job's failure (out of memory, a bug) must not cost the others or the comparison,
        # which Hydra skips when a job raises.
        if not in_sweep:
            raise
        write_json(run_dir / "status.json", {"status": RunStatus.FAILED, "error": f"{type(e).__name__}: {e}",
                                             "traceback": traceback.format_exc()} | labels)
        log.error("job failed: %s", traceback.format_exc())
        return
    write_json(run_dir / "status.json", {"status": RunStatus.FINISHED})


if __name__ == "__main__":
    main()
