"""Atomic writes: a reader (or a crashed run) never sees half a file."""

import json
import math
import os
import tempfile
from pathlib import Path

import pandas as pd


def _write_atomic(path: Path, write) -> None:
    """Write through `write(file)` into a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
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
