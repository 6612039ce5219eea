"""A run folder on disk: atomic writes (a reader, or a crashed run, never sees half a file), the usual file
permissions (0666 less the umask, so results on a shared file system stay readable to colleagues), and the
folder's lifecycle: one run at a time holds it, a new run clears the old results first, and `status.json` always
says where the run stands."""

import contextlib
import enum
import fcntl
import json
import math
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a table is written: a refused run answers without it
    import pandas as pd

# What a run writes into its folder; a new run into the folder removes these first (and nothing else).
RESULT_FILES = ("status.json", "summary.json", "requests.csv", "steps.csv", "requests.parquet", "steps.parquet",
                "replicas.csv", "report.md", "tokens.jsonl", "trace.jsonl", "config.yaml")
LOCK_FILE = ".lock"


class RunStatus(enum.StrEnum):
    """What a run folder's `status.json` says."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # stopped by SIGINT / SIGTERM; what was measured is written, marked partial


class FolderInUse(RuntimeError):
    pass


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM during a run; a BaseException, as KeyboardInterrupt is, so no `except Exception` eats it."""

    def __init__(self, signal):
        super().__init__(signal.name)
        self.signal = signal


@contextlib.contextmanager
def claim_run_folder(run_dir: Path, labels: dict):
    """Hold `run_dir` for one run: refuse if another process holds it, clear an earlier run's results, and say
    `running` until the caller writes the final status. The lock is an flock, so a killed run releases it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise FolderInUse(f"{run_dir} is in use by another run ({holder}); give this one its own "
                              "hydra.run.dir") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        for name in RESULT_FILES:
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "plots", ignore_errors=True)
        write_status(run_dir, RunStatus.RUNNING, labels | {"pid": os.getpid()})
        yield


def write_status(run_dir: Path, status: RunStatus, details: dict | None = None) -> None:
    write_json(run_dir / "status.json", {"status": status, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
               | (details or {}))


def read_status(run_dir: Path) -> dict:
    """The folder's status.json, or {} when it has none; a damaged one reads as `{"status": "damaged", ...}`."""
    path = run_dir / "status.json"
    if not path.is_file():
        return {}
    try:
        status = json.loads(path.read_text())
        if not isinstance(status, dict) or "status" not in status:
            raise ValueError("no status in it")
        return status
    except (ValueError, UnicodeDecodeError, OSError) as e:
        return {"status": "damaged", "error": f"status.json unreadable: {e}"}


def folder_in_use(run_dir: Path) -> bool:
    """Whether a live run holds the folder (a `running` status with no holder means the run died)."""
    try:
        with open(run_dir / LOCK_FILE) as lock:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def is_run_folder(path: Path) -> bool:
    """A folder a run wrote into: it has a status (`python -m harness`) or a summary (`run_job` called directly)."""
    return (path / "status.json").is_file() or (path / "summary.json").is_file()


def find_run_folders(root: Path) -> list[Path]:
    """The run folders at or below `root`, at any depth (a run, a sweep, a sweep whose job folders a value with
    `/` once nested, a folder of sweeps), in path order. A run folder's own subfolders are not searched, nor hidden
    folders (Hydra's `.hydra`)."""
    if is_run_folder(root):
        return [root]
    found = []
    for folder, subfolders, _ in os.walk(root):
        if is_run_folder(Path(folder)):
            found.append(Path(folder))
            subfolders.clear()
        else:
            subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
    return sorted(found)


def _write_atomic(path: Path, write) -> None:
    """Write through `write(file)` into a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    # os.open with 0o666 lets the umask decide, as a plain open() would; mkstemp would force 0600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    _write_atomic(path, lambda f: f.write(text.encode()))


def write_png(path: Path, figure) -> None:
    """A matplotlib figure as PNG."""
    _write_atomic(path, lambda f: figure.savefig(f, format="png", dpi=110))


def write_json(path: Path, data: dict) -> None:
    # NaN is not JSON: an undefined metric (no finished request, say) is written as null.
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}
    write_text(path, json.dumps(clean, indent=2) + "\n")


def write_csv(path: Path, table: "pd.DataFrame") -> None:
    write_text(path, table.to_csv(index=False))


def write_table(run_dir: Path, name: str, table: "pd.DataFrame", fmt: str) -> str:
    """`table` as `<name>.csv` or `<name>.parquet` in `run_dir`; returns the file's name."""
    file = f"{name}.{fmt}"
    if fmt == "parquet":
        _write_atomic(run_dir / file, lambda f: table.to_parquet(f, index=False))
    else:
        write_csv(run_dir / file, table)
    return file
