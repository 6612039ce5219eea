"""The replay loop: a benchmark client, one arrival stream, one or several replicas, advanced in time order."""

import dataclasses
import heapq
import math
from collections import deque

from tqdm import tqdm

from workloads import RequestSpec


class Client:
    """The benchmark client, as `vllm bench serve` is one. Open loop: each request is sent when the workload wants
    it. Closed loop (`max_concurrency` C, `--max-concurrency`): a request is sent only while fewer than C of the
    client's requests are outstanding, waiting for a free slot in arrival order; with a rate too, as vLLM
    combines them. A request stops being outstanding when it finishes or is rejected (`complete`). A sent request
    reaches the engine `latency_s` later (the server's front end: HTTP, tokenization), and no sooner than
    `service_s` after the request before it: the front end handles requests one at a time. That spacing is why
    requests sent together do not stay in lockstep on a real server: the first one starts a step alone.

    A front end that `batches` (vLLM's, read in 0.10.2, 0.11 and 0.32: each request's handler awaits its tokens
    between its parsing and its hand-off, from a micro-batching tokenizer to 0.23 and a thread pool since 0.24, on one
    event loop that runs ready work in the order it became ready) takes in every request sent by the time it is free,
    parses them one after another, `service_s` each, and hands them all to the engine when the last is parsed (each
    no sooner than `latency_s` after its send): a burst reaches the engine as one, late. (vLLM then hands them over
    one at a time, and on vLLM 0.32 here a closed loop's first request of a group steps alone: README "The whole loop,
    on vLLM here" says what a serial hand-off did to the fit.)

    A conversation's later turn (`RequestSpec.follows`) is held until the turn before it ends (finished, or
    rejected: it is still sent, as the user would type it), and arrives `think_s` after that."""

    def __init__(self, specs: list[RequestSpec], max_concurrency: int | None = None, latency_s: float = 0.0,
                 service_s: float = 0.0, batches: bool = False):
        # Requests free to go, by arrival (then id): the workload's first turns, sorted once, and a min-heap of the
        # rest (turns released as conversations go on, batches taken back), which may arrive before them. (One heap
        # of a million requests cost a replay more than its front end's work.)
        self._first = deque(sorted((s.arrival_s, s.request_id, s) for s in specs if s.follows is None))
        self._pending: list[tuple[float, int, RequestSpec]] = []
        self._next_turn = {s.follows: s for s in specs if s.follows is not None}  # previous turn's id → turn
        self.latency_s, self.service_s, self.batches = latency_s, service_s, batches
        self._last_delivery_s = -math.inf  # one at a time: when the last request reached the engine
        # Batches: the requests the front end takes in together (each as it was pending, with the slot it took and its
        # send time), when it hands them over and when it handed over the batch before, and whether it has begun to.
        self._batch: deque[tuple[tuple[float, int, RequestSpec], float | None, float]] = deque()
        self._batch_end_s = self._previous_end_s = -math.inf
        self._handing_over = False
        # Times at which the free slots became free (a min-heap); None: open loop, no slots. More slots than requests
        # change nothing: as many as the requests, so a cap of a billion costs what the workload does.
        self._free = [0.0] * min(max_concurrency, len(specs)) if max_concurrency else None

    @property
    def has_pending(self) -> bool:
        return bool(self._first or self._pending or self._next_turn or self._batch)

    @property
    def next_send_s(self) -> float:
        """When the next request goes out; infinite while none can (no request free to go, or every slot taken)."""
        head = self._pending_head()
        if head is None:
            return math.inf
        if self._free is None:
            return head[0]
        return max(head[0], self._free[0]) if self._free else math.inf

    def _pending_head(self) -> tuple[float, int, RequestSpec] | None:
        """The next request free to go, as it waits (None: none)."""
        if self._pending and (not self._first or self._pending[0] < self._first[0]):
            return self._pending[0]
        return self._first[0] if self._first else None

    @property
    def next_delivery_s(self) -> float:
        """When the next request reaches an engine."""
        if not self.batches:
            return max(self.next_send_s + self.latency_s, self._last_delivery_s + self.service_s)
        batch = self._batch_in_hand()
        return max(batch[0][2] + self.latency_s, self._batch_end_s) if batch else math.inf

    def send(self) -> tuple[RequestSpec, float]:
        """The next request and the time it is sent."""
        if self.batches:
            (_, _, spec), _, sent_s = self._batch_in_hand().popleft()
            self._handing_over = True
        else:
            self._last_delivery_s = self.next_delivery_s
            (_, _, spec), _, sent_s = self._take_next()
        return spec, sent_s

    def _take_next(self) -> tuple[tuple[float, int, RequestSpec], float | None, float]:
        """The next request to go as it was pending, the free slot it takes (None: open loop), and its send time."""
        sent_s = self.next_send_s
        slot = heapq.heappop(self._free) if self._free is not None else None
        entry = self._pending_head()
        if self._pending and entry is self._pending[0]:
            heapq.heappop(self._pending)
        else:
            self._first.popleft()
        return entry, slot, sent_s

    def _batch_in_hand(self) -> deque:
        """The requests the front end is handing over; once it has handed over the last, the next batch: every
        request sent by the time it is free again (a closed loop's: those its free slots let go), handed over once
        all are parsed. Empty while no request can be sent."""
        if not self._batch:
            start_s = max(self.next_send_s, self._batch_end_s)
            while self.next_send_s <= start_s < math.inf:
                self._batch.append(self._take_next())
            if self._batch:
                self._previous_end_s = self._batch_end_s
                self._batch_end_s = start_s + len(self._batch) * self.service_s
                self._handing_over = False
        return self._batch

    def complete(self, request_id: int, time_s: float) -> None:
        """Request `request_id` ended at `time_s`: its slot is free, and its conversation's next turn is due."""
        if self._free is not None:
            heapq.heappush(self._free, time_s)
        turn = self._next_turn.pop(request_id, None)
        if turn is not None:
            arrival_s = time_s + turn.think_s
            heapq.heappush(self._pending, (arrival_s, turn.request_id, dataclasses.replace(turn, arrival_s=arrival_s)))
        if (self._free is not None or turn is not None) and self._batch and not self._handing_over:
            self._take_batch_back()

    def _take_batch_back(self) -> None:
        """A batch taken in ahead of its time goes back to wait: a request freed to go since may go before it, or with
        it, and the next look takes it in again with what is known now."""
        for entry, slot, _ in self._batch:
            heapq.heappush(self._pending, entry)
            if slot is not None:
                heapq.heappush(self._free, slot)
        self._batch.clear()
        self._batch_end_s = self._previous_end_s


class Arrivals:
    """The requests still to come, as a replica sees them while it steps. A lone replica receives every request
    the client sends, so it may take them in itself; with several, the replay loop routes each one first."""

    def __init__(self, client: Client, lone: bool):
        self._client = client
        self._lone = lone
        # With a closed-loop client, the clock of the next other replica to step: its finishes free the client's
        # slots, so a replica stepping beyond it in bulk could miss a request sent meanwhile. An open-loop client's
        # sends do not wait on finishes: each replica may run up to the next delivery.
        self.horizon_s = math.inf

    @property
    def next_s(self) -> float:
        return self._client.next_delivery_s

    def deliver_due(self, engine) -> None:
        """Hand `engine` every request that reached it by its clock, if it is the lone replica (a rejection frees a
        client slot at once, so the next request may be due too)."""
        while self._lone and self._client.next_delivery_s <= engine.clock:
            spec, sent_s = self._client.send()
            engine.add_request(spec, sent_s)


def replay(engines: list, specs: list[RequestSpec], route=None, progress: bool = False, desc: str = "",
           max_concurrency: int | None = None, frontend_latency_s: float = 0.0,
           frontend_service_s: float = 0.0, frontend_batches: bool = False) -> None:
    """Co-simulate replicas behind one client, in time order.

    The next event is either the next request reaching the engines (routed by `route(engines, spec)`, which sees
    every replica as it is at that moment; one replica needs no router) or the step of the busy replica whose
    clock is furthest behind. An idle replica's clock jumps to the request it receives.
    """
    if route is None:
        if len(engines) > 1:
            raise ValueError("several replicas need a router")
        route = _only
    client = Client(specs, max_concurrency, frontend_latency_s, frontend_service_s, frontend_batches)
    for engine in engines:
        engine.on_done = client.complete
    arrivals = Arrivals(client, lone=len(engines) == 1)
    bar = tqdm(total=len(specs), unit="req", disable=not progress, desc=desc, leave=False)
    while True:
        busy = [e for e in engines if e.has_work]
        next_step = min(busy, key=_clock) if busy else None
        delivery_s = client.next_delivery_s
        if delivery_s < math.inf and (next_step is None or delivery_s <= next_step.clock):
            spec, sent_s = client.send()
            target = route(engines, spec)
            if not target.has_work:
                target.clock = max(target.clock, delivery_s)
            target.add_request(spec, sent_s)
        elif next_step is not None:
            if max_concurrency:
                arrivals.horizon_s = min((e.clock for e in busy if e is not next_step), default=math.inf)
            next_step.step(arrivals)
        else:
            break
        if progress:  # a million requests replay in some 1.4 million iterations: nothing here unless shown
            _show(bar, engines)
    bar.close()
    if client.has_pending:  # every slot would have to be held by a request no replica runs: a bug
        raise RuntimeError("the client still holds requests with no replica busy: a lost completion")


def _clock(engine) -> float:
    return engine.clock


def _show(bar: tqdm, engines: list) -> None:
    """The bar: requests done, and output tokens per simulated second so far."""
    clock = max(e.clock for e in engines)
    if clock > 0:
        bar.set_postfix_str(f"{sum(e.num_output_tokens for e in engines) / clock:.0f} output tok/s", refresh=False)
    bar.update(sum(e.num_done for e in engines) - bar.n)


def _only(engines: list, spec: RequestSpec):
    return engines[0]
