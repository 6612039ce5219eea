"""What a reader needs to reproduce or distrust a timing: the machine, the versions, the commit."""

import importlib.metadata
import platform
import subprocess
from pathlib import Path


def environment(device: str = "cpu", dtype: str = "") -> dict:
    """Device, dtype, threads, package versions and the git commit. Imports torch only if a run already has."""
    import sys

    torch = sys.modules.get("torch")
    device_name = platform.processor() or platform.machine()
    if torch is not None and device.startswith("cuda"):
        device_name = torch.cuda.get_device_name(device)
    return {
        "device": device, "device_name": device_name, "dtype": dtype.removeprefix("torch."),
        "threads": torch.get_num_threads() if torch is not None else None,
        "torch": _version("torch"), "transformers": _version("transformers"), "triton": _version("triton"),
        "python": platform.python_version(), "git_commit": _git_commit(),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return result.stdout.strip() or None
