"""Arrival processes: when each of `n` requests reaches the server, in seconds from t=0."""

import numpy as np

ARRIVALS = ("offline", "poisson", "gamma", "constant")


def arrival_times(kind: str, n: int, rng: np.random.Generator, rate: float | None = None,
                  burstiness: float = 1.0) -> np.ndarray:
    """Sorted arrival times `[n]`. As in `vllm bench`, a rate of None means no rate limit: all arrive at t=0.
    The parameters are checked by the config schema (`workloads.config`).

    `gamma` follows vLLM's benchmark: inter-arrival gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)),
    so the mean rate is `rate` whatever the burstiness, and burstiness 1 is a Poisson process (smaller is
    burstier: the gaps' coefficient of variation is 1/sqrt(burstiness)).
    """
    if kind == "offline" or rate is None:
        return np.zeros(n)
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    else:  # gamma
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    # The first request arrives at t=0 so every run starts busy; the rest keep their gaps.
    gaps[0] = 0.0
    return np.cumsum(gaps)
