"""The code base stays ruff-clean (rules in pyproject.toml)."""

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
