"""Routers: which replica of a simulated cluster gets an arriving request."""

from harness.core.engine import Engine
from workloads import RequestSpec


class RoundRobin:
    def __init__(self):
        self.next = 0

    def __call__(self, engines: list[Engine], spec: RequestSpec) -> Engine:
        engine = engines[self.next % len(engines)]
        self.next += 1
        return engine


def least_outstanding(engines: list[Engine], spec: RequestSpec) -> Engine:
    """The replica with the fewest unfinished requests right now; the lowest index on ties."""
    return min(engines, key=lambda e: e.num_outstanding)


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": lambda: least_outstanding}
