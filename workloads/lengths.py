"""Length distributions for prompts and outputs, each clamped to [min, max] tokens. Their parameters are checked
by the config schema (`workloads.config`): here they are drawn."""

import numpy as np

from workloads.config import Exponential, Fixed, LengthSpec, LogNormal, Normal, Quantiles, Uniform


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw `n` integer lengths from `spec`, clamped to its min/max."""
    return np.clip(np.rint(_draw(spec, n, rng)), spec.min, spec.max).astype(np.int64)


def _draw(spec: LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Unclamped real-valued draws."""
    match spec:
        case Fixed():
            return np.full(n, float(spec.value))
        case Uniform():
            low, high = spec.bounds
            return np.floor(rng.uniform(low, high + 1, size=n))
        case Normal():
            return rng.normal(spec.mean, spec.std, size=n)
        case LogNormal():
            mu = np.log(spec.mean) - spec.sigma**2 / 2
            return rng.lognormal(mu, spec.sigma, size=n)
        case Exponential():
            return rng.exponential(spec.mean, size=n)
        case Quantiles():
            # Inverse-CDF sampling from an evenly spaced quantile table (q0, q1, ..., q100).
            table = np.asarray(spec.values, dtype=float)
            return np.interp(rng.uniform(0, 1, size=n), np.linspace(0, 1, len(table)), table)
    raise TypeError(f"not a length distribution: {spec!r}")
