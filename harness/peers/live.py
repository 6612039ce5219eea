"""Replaying a workload against a system that keeps its own clock: a server, or another engine's thread.

Our engines run on a virtual clock (each step moves it by the step's duration); a peer runs in wall time, so the
replay does too: the same `Client` decides when each request goes out (open loop at its arrival time, closed loop
when a slot frees), and a request's times are wall-clock seconds from the start of the run. `submit` sends one
request and returns when it has ended, having stamped its tokens, its finish, or its failure on the `Request`.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable

from tqdm import tqdm

from harness.core.engine import request_for
from harness.core.records import RunRecords
from harness.core.replay import Client
from strategies import Request, RequestStatus
from workloads import RequestSpec

Submit = Callable[[Request, Callable[[], float]], Awaitable[None]]


async def live_replay(specs: list[RequestSpec], submit: Submit, records: RunRecords,
                      max_concurrency: int | None = None, progress: bool = False, desc: str = "") -> None:
    """Send every request when the client would and wait for all of them, recording each in `records` as it is
    sent. A request that `submit` lets raise ends `failed` with the error as its reason: one request never stops
    the run."""
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    client = Client(specs, max_concurrency)
    in_flight: set[asyncio.Task] = set()
    bar = tqdm(total=len(specs), unit="req", disable=not progress, desc=desc, leave=False)

    async def run_one(request: Request) -> None:
        try:
            await submit(request, clock)
        except Exception as e:  # noqa: BLE001 - any error of one request is that request's failure
            fail(request, f"{type(e).__name__}: {e}", clock())
        client.complete(request.request_id, clock())
        bar.update()

    while client.has_pending or in_flight:
        wait_s = client.next_send_s - clock()
        if client.has_pending and wait_s <= 0:
            spec, _ = client.send()
            request = request_for(spec, clock())
            records.requests.append(request)
            in_flight.add(asyncio.create_task(run_one(request)))
            continue
        timeout = wait_s if client.has_pending and wait_s < float("inf") else None
        if not in_flight:
            await asyncio.sleep(timeout)  # nothing out: only the next arrival can happen
            continue
        _, in_flight = await asyncio.wait(in_flight, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    bar.close()


def fail(request: Request, reason: str, now_s: float) -> None:
    """End `request` as failed (the peer's error), keeping the tokens it had already streamed."""
    request.status = RequestStatus.FAILED
    request.reject_reason = reason
    request.finish_s = now_s
