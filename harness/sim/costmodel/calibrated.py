"""A cost model calibrated on this machine: a profile table of measured steps, interpolated.

Per layout (ragged, padded) the profile measures step durations on a grid of (tokens per step, keys per token).
Prediction is bilinear between grid points and linear beyond them, so a batch outside the profiled range gets an
extrapolated answer instead of an error.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.sim.costmodel.shape import StepShape

if TYPE_CHECKING:  # pandas is imported where a profile is read: a run without one starts half a second sooner
    import pandas as pd

COLUMNS = ["layout", "num_tokens", "mean_context", "duration_s"]


def _segment(grid: np.ndarray, x: float) -> tuple[int, float]:
    """Index i of the segment [grid[i], grid[i+1]] to use for x, and x's fraction along it (<0 or >1 beyond)."""
    if len(grid) == 1:
        return 0, 0.0
    i = int(np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2))
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


class GridInterpolator:
    """Bilinear interpolation over a rectangular grid, extrapolating linearly from the edge segments."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray, values: np.ndarray):
        self.xs, self.ys, self.values = xs, ys, values  # values [len(xs), len(ys)]

    @classmethod
    def from_points(cls, table: "pd.DataFrame") -> "GridInterpolator":
        grid = table.pivot_table(index="num_tokens", columns="mean_context", values="duration_s", aggfunc="median")
        values = grid.to_numpy(dtype=float)
        values = _fill_missing(values, grid.columns.to_numpy(dtype=float))
        # Measurements are noisy; the model must not predict that more work takes less time.
        values = _monotone(_monotone(values, axis=0), axis=1)
        return cls(grid.index.to_numpy(dtype=float), grid.columns.to_numpy(dtype=float), values)

    def __call__(self, x: float, y: float) -> float:
        i, u = _segment(self.xs, x)
        j, v = _segment(self.ys, y)
        v00 = self.values[i, j]
        v10 = self.values[min(i + 1, len(self.xs) - 1), j]
        v01 = self.values[i, min(j + 1, len(self.ys) - 1)]
        v11 = self.values[min(i + 1, len(self.xs) - 1), min(j + 1, len(self.ys) - 1)]
        return float((1 - u) * (1 - v) * v00 + u * (1 - v) * v10 + (1 - u) * v * v01 + u * v * v11)


def _monotone(values: np.ndarray, axis: int) -> np.ndarray:
    """Non-decreasing along `axis`: the mean of the running maximum from below and the running minimum from
    above, so one noisy spike moves its neighbours half as far as a plain running maximum would."""
    from_below = np.maximum.accumulate(values, axis=axis)
    from_above = np.flip(np.minimum.accumulate(np.flip(values, axis=axis), axis=axis), axis=axis)
    return (from_below + from_above) / 2


def _fill_missing(values: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Cells the profile could not measure (fewer keys than a chunk's own tokens) are extended along the row."""
    filled = values.copy()
    for row in filled:
        known = ~np.isnan(row)
        if not known.any():
            raise ValueError("a profile row has no measurement at all")
        if known.sum() == 1:
            row[~known] = row[known][0]
        else:
            slope = np.polyfit(ys[known][:2], row[known][:2], 1)
            row[~known] = np.maximum(np.polyval(slope, ys[~known]), row[known].min())
    return filled


class CalibratedCostModel:
    def __init__(self, table: "pd.DataFrame", step_overhead_s: float = 0.0):
        missing = set(COLUMNS) - set(table.columns)
        if missing:
            raise ValueError(f"profile table lacks columns {sorted(missing)}")
        self.step_overhead_s = step_overhead_s
        self.layouts = {layout: GridInterpolator.from_points(part) for layout, part in table.groupby("layout")}
        if set(self.layouts) != {"ragged", "padded"}:
            raise ValueError(f"profile needs both ragged and padded measurements, has {sorted(self.layouts)}")

    @classmethod
    def load(cls, path: str | Path) -> "CalibratedCostModel":
        """A profile CSV written by `python -m harness.sim.step_profile`; its `# key: value` lines record the
        environment it was measured in, and the engine's own time per step (`step_overhead_s`), which the model
        adds."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"profile {str(path)!r} does not exist; make one with "
                                    "python -m harness.sim.step_profile")
        meta = {}
        for line in path.read_text().splitlines():
            if line.startswith("# ") and ": " in line:
                key, value = line[2:].split(": ", 1)
                meta[key] = value
        import pandas as pd

        return cls(pd.read_csv(path, comment="#"), float(meta.get("step_overhead_s", 0.0)))

    def overhead(self, shape: StepShape, busy) -> float:
        """The engine's own seconds per step, as the profile measured it on this machine (the runner here schedules
        and runs one step after the other: nothing overlaps)."""
        return self.step_overhead_s

    def predict(self, shape: StepShape) -> float:
        """Predicted seconds inside the model for a step of this shape."""
        grid = self.layouts["padded" if shape.padded else "ragged"]
        return max(grid(shape.num_tokens, shape.mean_context), 0.0)

    def predict_many(self, shape: StepShape) -> np.ndarray:
        """`predict` for many steps at once: a shape whose fields are arrays, one entry per step."""
        grid = self.layouts["padded" if shape.padded else "ragged"]
        tokens, context = np.broadcast_arrays(shape.num_tokens, shape.mean_context)
        return np.array([max(grid(t, c), 0.0) for t, c in zip(tokens.tolist(), context.tolist())])
