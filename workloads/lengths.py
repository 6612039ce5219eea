"""Length distributions for prompts and outputs, each clamped to [min, max] tokens."""

import numpy as np

from workloads.spec import WorkloadError

DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "quantiles")


def sample_lengths(spec: dict, n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """Draw `n` integer lengths from `spec` (a config mapping with a `dist` key), clamped to its min/max."""
    dist = spec.get("dist")
    if dist == "fixed":
        raw = np.full(n, float(spec["value"]))
    elif dist == "uniform":
        raw = rng.uniform(spec["low"], spec["high"] + 1, size=n)
    elif dist == "lognormal":
        # Parameterised by the mean of the lengths themselves, the way papers report them.
        sigma = float(spec["sigma"])
        mu = np.log(float(spec["mean"])) - sigma**2 / 2
        raw = rng.lognormal(mu, sigma, size=n)
    elif dist == "quantiles":
        # Inverse-CDF sampling from an evenly spaced quantile table (q0, q1, ..., q100).
        table = np.asarray(spec["values"], dtype=float)
        raw = np.interp(rng.uniform(0, 1, size=n), np.linspace(0, 1, len(table)), table)
    else:
        raise WorkloadError(f"{what}: unknown length distribution {dist!r}; choose one of {DISTRIBUTIONS}")
    low, high = int(spec.get("min", 1)), int(spec.get("max", 1 << 30))
    if not 1 <= low <= high:
        raise WorkloadError(f"{what}: need 1 <= min <= max, got min={low}, max={high}")
    return np.clip(np.rint(raw), low, high).astype(np.int64)
