"""What strategies and the engine share: the request, its state, the batch plan and the strategy interface.

Who writes what (one writer per piece of state, as in vLLM v1's `update_from_output`):
- the engine writes every field of a `Request` and moves requests between its queues; it applies each plan's
  admissions and preemptions and each step's result;
- a strategy only reads requests and queues, holds cache blocks for requests through `KVBlocks`, and says in
  its `BatchPlan` what it decided: which waiting requests enter (`admitted`), which running ones are evicted
  (`preempted`), and which tokens run;
- the runner reads the plan and the block tables, and returns tokens and a duration.
"""

import enum
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RequestStatus(enum.IntEnum):
    """A request's lifecycle. Whether it is prefilling or decoding is not a state: it follows from its token
    counts (`Request.is_decoding`), as vLLM v1 schedules tokens per request, with no prefill or decode phase."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # evicted from the cache, back in the queue to recompute its tokens
    FINISHED = 3
    REJECTED = 4  # could never be served (longer than the context, bigger than the cache)
    FAILED = 5  # a peer's error ended it (a server's HTTP error, a timeout, a refused connection): `reject_reason`

    @property
    def label(self) -> str:
        """The name written in result tables."""
        return self.name.lower()


@dataclass(eq=False, slots=True)  # slots: a million of them, read at every step, stay small
class Request:
    """One request inside an engine. Written by the engine alone (see the module docstring)."""

    request_id: int
    arrival_s: float  # when the workload wanted it sent
    token_ids: list[int]  # prompt, then every generated token, where ids are kept (a simulator keeps none)
    num_prompt_tokens: int
    max_new_tokens: int
    num_output_tokens: int = 0  # generated so far (a server's usage count; the simulator's count)
    sent_s: float | None = None  # when the client sent it: arrival_s, or later if a closed-loop client held it
    status: RequestStatus = RequestStatus.WAITING
    # Tokens whose K/V sit in the cache. The last token in `token_ids` is never computed until scheduled.
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    # Prompt tokens found in the prefix cache when it was first admitted (None until then).
    num_cached_tokens: int | None = None
    # The workload's (key, tokens) pieces the prompt starts with, shared by key: what names its blocks for a prefix
    # cache when it has no token ids (a simulation).
    prefix_pieces: tuple[tuple[int, int], ...] = ()
    reject_reason: str | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    # When each output token was produced, where a writer keeps them (the step-by-step engine, peers). The
    # simulated engine keeps first_token_s and finish_s per request and its inter-token gaps per step instead:
    # a million requests' tokens would not fit in memory.
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None

    def __post_init__(self) -> None:
        if self.sent_s is None:
            self.sent_s = self.arrival_s

    @property
    def num_tokens(self) -> int:
        """Prompt and generated tokens: what the cache will hold once all but the last are computed."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_decoding(self) -> bool:
        """Its prompt is in the cache and only the last sampled token is not: the next step is one decode."""
        computed = self.num_computed_tokens
        return self.num_tokens - computed == 1 and computed >= self.num_prompt_tokens

    @property
    def max_num_tokens(self) -> int:
        """Tokens held in the cache when the request finishes (the last sampled token is never computed)."""
        return self.num_prompt_tokens + self.max_new_tokens - 1


@dataclass(slots=True)
class ScheduledChunk:
    """`num_tokens` tokens of one request, starting at `start` (its num_computed_tokens), run in one step."""

    request: Request
    start: int
    num_tokens: int
    # Whether this chunk reaches the request's last known token, so the step samples its next one. Fixed when
    # the chunk is planned: the request grows once the step is applied.
    samples: bool = field(init=False)
    # One new token after the prompt; anything else (prompt chunks, recompute after preemption) is prefill.
    is_decode: bool = field(init=False)

    def __post_init__(self) -> None:
        request = self.request
        self.samples = self.start + self.num_tokens == request.num_tokens
        self.is_decode = self.num_tokens == 1 and request.is_decoding


@dataclass
class BatchPlan:
    """One forward pass, and the queue changes the strategy decided for it.

    Ragged: the chunks concatenated into `[T]`. Padded: a `[rows, width]` rectangle where each chunk is
    left-padded to the widest one, and the rows of `idle_rows` (finished requests whose rows a padded engine
    keeps) are computed all padding, attending over their own cache rows as a padded engine would.
    `admitted` are taken from the head of the waiting queue, in order; `preempted` leave the running list, in the
    order they were chosen, and go back to the head of the queue.
    """

    chunks: list[ScheduledChunk]
    padded: bool = False
    idle_rows: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.chunks) + len(self.idle_rows)

    @property
    def row_width(self) -> int:
        return max((c.num_tokens for c in self.chunks), default=0)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_padding_tokens(self) -> int:
        return self.num_rows * self.row_width - self.num_scheduled_tokens if self.padded else 0


class KVBlocks(Protocol):
    """The part of the block allocator a strategy may use: bookkeeping only, no tensors."""

    num_blocks: int
    block_size: int

    @property
    def num_free_blocks(self) -> int: ...

    def num_blocks_for(self, num_tokens: int) -> int: ...

    def num_cached_tokens(self, request: Request) -> int:
        """Leading tokens of a request about to enter that the prefix cache holds (0 without one)."""

    def allocate(self, request: Request, num_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Hold slots for `num_tokens` of the request's tokens, its first `num_cached_tokens` from the cache."""

    def fits(self, request: Request, num_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Whether `allocate` would hold `num_tokens` slots for a request about to enter, holding nothing."""

    def free(self, request: Request) -> None: ...


class Strategy(ABC):
    """A scheduling policy: reads the engine's queues and returns a plan; never writes a request."""

    name: str

    def __init__(self, kv: KVBlocks):
        self.kv = kv

    @property
    @abstractmethod
    def max_concurrency(self) -> int:
        """The most requests that can hold cache blocks at once."""

    @abstractmethod
    def schedule(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        """Plan the next step. `waiting` is FIFO; `running` is in admission order (oldest first)."""

    def on_finished(self, request: Request) -> None:
        """Called by the engine when a request is done; by default its blocks go back at once."""
        self.kv.free(request)
