"""Atomic writes: a reader (or a crashed run) never sees half a file. Files get the usual permissions (0666 less
the umask), so results on a shared file system stay readable to colleagues."""

import enum
import json
import math
import os
import uuid
from pathlib import Path

import pandas as pd


class RunStatus(str, enum.Enum):
    """What a run folder's `status.json` says."""

    FINISHED = "finished"
    FAILED = "failed"


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


def write_csv(path: Path, table: pd.DataFrame) -> None:
    write_text(path, table.to_csv(index=False))
