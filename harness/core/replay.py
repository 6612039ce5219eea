"""The replay loop: one arrival stream, one or several replicas, advanced in time order."""

import math
from collections import deque

from tqdm import tqdm

from workloads import RequestSpec


class Arrivals:
    """The requests still to come, as a replica sees them while it steps. A lone replica receives every arrival,
    so it may take them in itself; with several, the replay loop routes each one first."""

    def __init__(self, pending: deque[RequestSpec], lone: bool):
        self._pending = pending
        self._lone = lone

    @property
    def next_s(self) -> float:
        return self._pending[0].arrival_s if self._pending else math.inf

    def take_arrived(self, clock: float) -> list[RequestSpec]:
        """The arrivals due by `clock`, if this replica may take them in itself; else none."""
        taken = []
        while self._lone and self._pending and self._pending[0].arrival_s <= clock:
            taken.append(self._pending.popleft())
        return taken


def replay(engines: list, specs: list[RequestSpec], route=None, progress: bool = False, desc: str = "") -> None:
    """Co-simulate replicas behind one arrival stream, in time order.

    The next event is either the next arrival (routed by `route(engines, spec)`, which sees every replica as it
    is at that moment; one replica needs no router) or the step of the busy replica whose clock is furthest
    behind. An idle replica's clock jumps to the arrival it receives.
    """
    if route is None:
        if len(engines) > 1:
            raise ValueError("several replicas need a router")
        route = _only
    pending = deque(sorted(specs, key=lambda s: s.arrival_s))
    arrivals = Arrivals(pending, lone=len(engines) == 1)
    bar = tqdm(total=len(specs), unit="req", disable=not progress, desc=desc, leave=False)
    while True:
        busy = [e for e in engines if e.has_work]
        next_step = min(busy, key=lambda e: e.clock) if busy else None
        if pending and (next_step is None or pending[0].arrival_s <= next_step.clock):
            spec = pending.popleft()
            target = route(engines, spec)
            if not target.has_work:
                target.clock = max(target.clock, spec.arrival_s)
            target.add_request(spec)
        elif next_step is not None:
            next_step.step(arrivals)
            clock = max(e.clock for e in engines)
            if progress and clock > 0:
                output = sum(e.num_output_tokens for e in engines)
                bar.set_postfix_str(f"{output / clock:.0f} output tok/s", refresh=False)
        else:
            break
        bar.update(sum(e.num_done for e in engines) - bar.n)
    bar.close()


def _only(engines: list, spec: RequestSpec):
    return engines[0]
