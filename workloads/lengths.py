"""Length distributions for prompts and outputs, each clamped to [min, max] tokens."""

import numpy as np

from workloads.spec import WorkloadError

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal", "exponential", "quantiles")


def sample_lengths(spec: dict, n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """Draw `n` integer lengths from `spec` (a config mapping with a `dist` key), clamped to its min/max."""
    try:
        raw = _draw(spec, n, rng, what)
    except KeyError as e:
        raise WorkloadError(f"{what}: dist={spec.get('dist')!r} needs the key {e.args[0]!r}") from None
    low, high = int(spec.get("min", 1)), int(spec.get("max", 1 << 30))
    if not 1 <= low <= high:
        raise WorkloadError(f"{what}: need 1 <= min <= max, got min={low}, max={high}")
    return np.clip(np.rint(raw), low, high).astype(np.int64)


def _draw(spec: dict, n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """Unclamped real-valued draws."""
    dist = spec.get("dist")
    if dist == "fixed":
        raw = np.full(n, float(spec["value"]))
    elif dist == "uniform":
        if "mean" in spec:  # vLLM's `random` dataset: mean * [1 - range_ratio, 1 + range_ratio]
            mean, ratio = float(spec["mean"]), float(spec.get("range_ratio", 0.0))
            low, high = mean * (1 - ratio), mean * (1 + ratio)
        else:
            low, high = float(spec["low"]), float(spec["high"])
        if not 0 <= low <= high:
            raise WorkloadError(f"{what}: uniform needs 0 <= low <= high, got low={low:g}, high={high:g}")
        raw = np.floor(rng.uniform(low, high + 1, size=n))
    elif dist == "normal":
        if not float(spec["std"]) >= 0:
            raise WorkloadError(f"{what}: normal needs std >= 0, got {spec['std']}")
        raw = rng.normal(float(spec["mean"]), float(spec["std"]), size=n)
    elif dist == "lognormal":
        # Parameterised by the mean of the lengths themselves, the way papers report them.
        sigma, mean = float(spec["sigma"]), float(spec["mean"])
        if not (sigma >= 0 and mean > 0):
            raise WorkloadError(f"{what}: lognormal needs mean > 0 and sigma >= 0, got {mean:g}, {sigma:g}")
        mu = np.log(mean) - sigma**2 / 2
        raw = rng.lognormal(mu, sigma, size=n)
    elif dist == "exponential":
        # With `max` as its cap: the output-length shape of the classic static-vs-continuous comparison.
        if not float(spec["mean"]) > 0:
            raise WorkloadError(f"{what}: exponential needs mean > 0, got {spec['mean']}")
        raw = rng.exponential(float(spec["mean"]), size=n)
    elif dist == "quantiles":
        # Inverse-CDF sampling from an evenly spaced quantile table (q0, q1, ..., q100).
        table = np.asarray(spec["values"], dtype=float)
        raw = np.interp(rng.uniform(0, 1, size=n), np.linspace(0, 1, len(table)), table)
    else:
        raise WorkloadError(f"{what}: unknown length distribution {dist!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    return raw
