"""`python -m harness strategy=... workload=...`: one run, or with -m a Hydra sweep of runs and a comparison.

Every run ends with a `status.json`: finished, failed (with the error; a traceback too when it is a bug), or
interrupted (SIGINT exits 130, SIGTERM 143, after writing what was measured, marked partial). Problems with the
input end in one line on stderr and a non-zero exit; in a sweep, one job's failure does not stop the others.
"""

import logging
import signal
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.analysis.results import (
    FolderInUse,
    RunInterrupted,
    RunStatus,
    claim_run_folder,
    read_status,
    write_status,
)
from harness.config import (
    PEERS,
    ConfigError,
    check_group_choices,
    check_output_dirs,
    expand_dict_overrides,
    validate,
)
from workloads import WorkloadError

log = logging.getLogger("harness")
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report them


def _interrupt(signum, frame):
    raise RunInterrupted(signal.Signals(signum))


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    if in_sweep and not cfg.overwrite and read_status(run_dir).get("status") == RunStatus.FINISHED:
        print(f"skipped: {run_dir} already has its results (overwrite=true runs it again)")
        return
    system = cfg.runner.name if cfg.runner.name in PEERS else cfg.strategy.name
    labels = {"strategy": system, "workload": cfg.workload.name, "rate": cfg.workload.get("rate"),
              "concurrency": cfg.get("concurrency")}  # so a failed job still has its place in a comparison
    for signum in EXIT_CODES:
        signal.signal(signum, _interrupt)
    try:
        with claim_run_folder(run_dir, labels):
            _run(cfg, run_dir, labels, in_sweep)
    except FolderInUse as e:
        _fail(str(e), in_sweep)


def _run(cfg: DictConfig, run_dir: Path, labels: dict, in_sweep: bool) -> None:
    try:
        validate(cfg)  # a bad config is refused before the job's imports (pandas, the engine: half a second)
        from harness.job import run_job

        run_job(cfg, run_dir)
    except (ConfigError, WorkloadError) as e:
        write_status(run_dir, RunStatus.FAILED, {"error": str(e)} | labels)
        _fail(str(e), in_sweep)
    except RunInterrupted as e:
        write_status(run_dir, RunStatus.INTERRUPTED, {"error": f"stopped by {e.signal.name}"} | labels)
        print(f"interrupted by {e.signal.name}: what was measured is in {run_dir} (marked partial)", file=sys.stderr)
        sys.exit(EXIT_CODES[e.signal])  # in a sweep too: the user stopped the sweep
    except Exception as e:
        # A bug or the machine (out of memory, say), not the input: keep the traceback, but in the status file.
        error = f"{type(e).__name__}: {e}"
        write_status(run_dir, RunStatus.FAILED, {"error": error, "traceback": traceback.format_exc()} | labels)
        log.debug("job failed: %s", traceback.format_exc())
        _fail(f"{error} (the traceback is in {run_dir / 'status.json'})", in_sweep)
    else:
        write_status(run_dir, RunStatus.FINISHED)


def _fail(message: str, in_sweep: bool) -> None:
    if in_sweep:
        log.error("%s", message)  # the sweep goes on; the comparison lists the failure
        return
    sys.exit(f"error: {message}")


if __name__ == "__main__":
    try:
        check_group_choices(sys.argv[1:])
        check_output_dirs(sys.argv[1:])
    except ConfigError as e:
        sys.exit(f"error: {e}")
    sys.argv[1:] = expand_dict_overrides(sys.argv[1:])
    main()
