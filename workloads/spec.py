"""The one currency between workloads and the engine: `RequestSpec`."""

from dataclasses import dataclass, field
from pathlib import Path

# The longest a workload may last, first arrival to last: beyond a decade a run's clock (seconds in 64-bit floats)
# resolves no better than tens of nanoseconds and soon rounds step times away; and a trace that long is a unit error.
MAX_SPAN_S = 10 * 365 * 86400


class WorkloadError(ValueError):
    """Bad workload input: the message names the source, the entry and the problem."""


def existing_file(path: str, what: str) -> Path:
    """`path` as a Path, or the error that names it: `what` says which kind of file was expected."""
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"{what} {path!r} does not exist")
    return file


# Kinds of prompt pieces (`RequestSpec.prefix_pieces`): a piece's key is `piece_key(kind, ...)`, so pieces of
# different kinds never share a key.
SYSTEM_PROMPT, RANDOM_PREFIX, TRACE_BLOCK, CONVERSATION = 1, 2, 3, 4


def piece_key(kind: int, *parts: int) -> int:
    """The key of a piece of prompt: the same integers, the same key, in every process (ints hash alike)."""
    return hash((kind, *parts))


def fits_context(prompt_len, max_new_tokens, max_model_len: int):
    """Whether a request fits a model's context: prompt and every new token (also elementwise on arrays)."""
    return prompt_len + max_new_tokens <= max_model_len


@dataclass(frozen=True, slots=True)  # slots: a million of them stay small
class RequestSpec:
    """A request as the workload wants it sent. `prompt_len` defaults to the ids' length; a request the model can
    never serve (longer than its context) carries its length without ids, which are never built for it."""

    request_id: int
    arrival_s: float
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    prompt_len: int = -1  # -1: len(prompt_ids)
    # (key, tokens) pieces the prompt starts with: the same key is the same tokens in every request that names it
    # (a shared system prompt, a trace's prefix blocks, the conversation so far). The rest is the request's own.
    prefix_pieces: tuple[tuple[int, int], ...] = ()
    # A conversation's later turn: sent `think_s` after the turn `follows` (a request id) ends; until then
    # `arrival_s` is its conversation's first arrival.
    follows: int | None = None
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_len == -1:
            object.__setattr__(self, "prompt_len", len(self.prompt_ids))
        elif self.prompt_ids and len(self.prompt_ids) != self.prompt_len:
            raise ValueError(f"request {self.request_id}: {len(self.prompt_ids)} prompt ids for prompt_len "
                             f"{self.prompt_len}")


@dataclass
class Workload:
    """A replayable workload plus what a reader of the results needs to know about where it came from."""

    name: str
    requests: list[RequestSpec]
    # Free-form provenance ("ShareGPT length profile, not the real data set", counts of dropped entries...).
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError(f"workload {self.name!r}: zero requests")
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise WorkloadError(f"workload {self.name!r}: duplicate request ids")
        for prev, cur in zip(self.requests, self.requests[1:]):
            if cur.arrival_s < prev.arrival_s:
                raise WorkloadError(
                    f"workload {self.name!r}: request {cur.request_id} arrives at {cur.arrival_s}s, "
                    f"before request {prev.request_id} at {prev.arrival_s}s (arrivals must be time-ordered)"
                )
        for r in self.requests:
            if r.prompt_len < 1 or r.max_new_tokens < 1 or not 0 <= r.arrival_s < float("inf"):
                raise WorkloadError(
                    f"workload {self.name!r}: request {r.request_id} has prompt_len={r.prompt_len}, "
                    f"max_new_tokens={r.max_new_tokens}, arrival_s={r.arrival_s}; all must be positive and finite"
                )
