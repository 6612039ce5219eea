"""What a `workload=` config may say: its keys, their types and ranges, and the rules between them.

`WorkloadConfig.parse` turns a config mapping into one of the source models below or raises one `WorkloadError`
line naming the key and the problem; `build_workload` takes only parsed configs, so nothing downstream checks a
value twice. `one_line` formats pydantic's errors for the run config too, so every config error reads alike.
"""

import math
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from workloads.arrivals import ARRIVALS
from workloads.spec import MAX_SPAN_S, WorkloadError


def _no_bool(value):
    if isinstance(value, bool):
        raise ValueError("should be a number, not true/false")
    return value


# Counts are whole numbers: 70.9 tokens or `true` requests are input errors, not something to round.
Count = Annotated[int, Field(strict=True, ge=1)]
Seed = Annotated[int, Field(strict=True, ge=0)]
Number = Annotated[float, BeforeValidator(_no_bool)]
Positive = Annotated[Number, Field(gt=0)]
NonNegative = Annotated[Number, Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class _Length(Strict):
    min: Count = 1
    max: Count = 1 << 30

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Fixed(_Length):
    dist: Literal["fixed"]
    value: Count


class Uniform(_Length):
    """`low`..`high`, or vLLM's random dataset: `mean` * [1 - range_ratio, 1 + range_ratio]."""

    dist: Literal["uniform"]
    low: NonNegative | None = None
    high: NonNegative | None = None
    mean: Positive | None = None
    range_ratio: Annotated[Number, Field(ge=0, lt=1)] = 0.0

    @model_validator(mode="after")
    def _one_form(self):
        if self.mean is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give low/high or mean/range_ratio, not both")
        elif self.low is None or self.high is None:
            raise ValueError("needs low and high (or mean and range_ratio)")
        elif self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        return self

    @property
    def bounds(self) -> tuple[float, float]:
        if self.mean is not None:
            return self.mean * (1 - self.range_ratio), self.mean * (1 + self.range_ratio)
        return self.low, self.high


class Normal(_Length):
    dist: Literal["normal"]
    mean: Number
    std: NonNegative

    @model_validator(mode="after")
    def _mean_within_bounds(self):
        # Outside [min, max] most draws would be clamped to one length: a fixed length the config did not say.
        if self.mean < self.min:
            raise ValueError(f"mean {self.mean:g} is below min {self.min}: most lengths would be clamped to {self.min}")
        if self.mean > self.max:
            raise ValueError(f"mean {self.mean:g} is above max {self.max}: most lengths would be clamped to {self.max}")
        return self


class LogNormal(_Length):
    """Parameterised by the mean of the lengths themselves, the way papers report them."""

    dist: Literal["lognormal"]
    mean: Positive
    sigma: NonNegative


class Exponential(_Length):
    """Cap it with `max`: the output-length shape of the classic static-vs-continuous comparison."""

    dist: Literal["exponential"]
    mean: Positive


class Quantiles(_Length):
    """Evenly spaced quantiles q0, q1, ..., q100 (any count >= 2), sampled by inverse CDF."""

    dist: Literal["quantiles"]
    values: Annotated[list[NonNegative], Field(min_length=2)]

    @model_validator(mode="after")
    def _sorted(self):
        if any(b < a for a, b in zip(self.values, self.values[1:])):
            raise ValueError("values must be non-decreasing quantiles")
        return self


LengthSpec = Annotated[Fixed | Uniform | Normal | LogNormal | Exponential | Quantiles, Field(discriminator="dist")]


class _Workload(Strict):
    name: str
    num_requests: Count
    seed: Seed
    arrival: Literal["trace", *ARRIVALS] = "poisson"
    rate: Positive | None = None  # requests/s; None: no limit, all at t=0 (as vllm bench)
    burstiness: Positive = 1.0
    max_prompt_len: Count | None = None  # clamps: truncate prompts, shorten outputs
    max_output_len: Count | None = None
    # The client (as vllm bench --max-concurrency): at most this many of its requests outstanding; None: open loop.
    max_concurrency: Count | None = None
    # Tokens of one system prompt every request starts with (shared: a prefix cache computes it once).
    system_prompt_len: Annotated[int, Field(strict=True, ge=0)] = 0

    @model_validator(mode="after")
    def _arrival_needs(self):
        if self.arrival == "trace" and self.source not in TRACE_SOURCES:
            raise ValueError(f"arrival=trace needs a source with timestamps; {self.source} has none")
        return self

    @model_validator(mode="after")
    def _within_the_clock(self):
        """Arrivals a run's clock can tell apart, whatever the seed draws: (n - 1) / rate within a decade."""
        if self.rate is not None and self.arrival not in ("offline", "trace") and self.num_requests > 1:
            span = (self.num_requests - 1) / self.rate
            if span > MAX_SPAN_S:
                raise ValueError(f"rate={self.rate:g} spreads {self.num_requests} requests over {span:.3g} s, more "
                                 "than ten years: a run's clock would round its step times away; raise the rate")
        return self


class SyntheticWorkload(_Workload):
    source: Literal["synthetic"]
    prompt: LengthSpec
    output: LengthSpec


class RandomWorkload(_Workload):
    """vLLM's `random` dataset (`vllm bench serve --dataset-name random`): input and output lengths uniform on the
    integers [floor(L * (1 - range_ratio)), ceil(L * (1 + range_ratio))] (outputs at least 1), after a random
    prefix of `prefix_len` tokens that every request shares."""

    source: Literal["random"]
    input_len: Count = 1024
    output_len: Count = 128
    range_ratio: Annotated[Number, Field(ge=0, lt=1)] = 0.0
    prefix_len: Annotated[int, Field(strict=True, ge=0)] = 0

    @model_validator(mode="after")
    def _prompts_not_empty(self):
        shortest = math.floor(self.input_len * (1 - self.range_ratio))
        if shortest < 1 and self.prefix_len == 0:
            raise ValueError(f"input_len={self.input_len} with range_ratio={self.range_ratio:g} draws prompts of 0 "
                             f"tokens (floor({self.input_len} x {1 - self.range_ratio:g}) = 0); raise input_len, "
                             "lower range_ratio or give a prefix_len")
        return self

    @property
    def longest_request(self) -> int:
        """The most tokens one request can hold: prefix, the longest input and the longest output."""
        return (self.prefix_len + math.ceil(self.input_len * (1 + self.range_ratio))
                + math.ceil(self.output_len * (1 + self.range_ratio)))


class ShareGPTFilter(Strict):
    """vLLM's sampling: drop pairs outside these limits."""

    min_len: Count = 4
    max_prompt_len: Count = 1024
    max_total_len: Count = 2048


class ShareGPTWorkload(_Workload):
    source: Literal["sharegpt"]
    path: str | None = None  # None: the embedded length profile
    filter: ShareGPTFilter = ShareGPTFilter()


class TraceWorkload(_Workload):
    source: Literal["azure", "burstgpt", "mooncake"]
    path: str | None = None
    sample: Literal["first", "random"] = "first"
    arrival: Literal["trace", *ARRIVALS] = "trace"
    time_scale: Positive = 1.0
    # A time window of the trace, in seconds from its first request: a day of a week-long trace.
    start_s: NonNegative = 0.0
    duration_s: Positive | None = None
    model: str | None = None  # burstgpt: keep one model's rows
    # azure: TIMESTAMP as numbers needs their unit; date-time strings need none.
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None

    @model_validator(mode="after")
    def _path_given(self):
        if not self.path:
            raise ValueError(f"workload={self.name} needs workload.path=<trace file>")
        if self.model is not None and self.source != "burstgpt":
            raise ValueError("model filters BurstGPT rows only")
        return self


class ConversationWorkload(_Workload):
    """Multi-turn conversations, as vLLM's multi-turn benchmark replays them: a conversation starts at the arrival
    process's times; each turn's prompt is the whole conversation so far (every earlier message and answer) and a
    new user message; the next turn is sent `think_s` after the answer ends. `num_requests` counts turns (the last
    conversation may be cut short). An agentic session is the same shape: long tool outputs as messages, short
    answers, little thinking."""

    source: Literal["conversation"]
    # Synthetic conversations: their lengths' distributions. Or ShareGPT's own, from `path`.
    turns: LengthSpec | None = None  # turns per conversation
    message_len: LengthSpec | None = None  # tokens of each new user message (or tool output)
    answer_len: LengthSpec | None = None  # tokens of each answer: the turn's max_new_tokens
    path: str | None = None  # a ShareGPT JSON file: its conversations, turn by turn, with their own answers
    think_s: NonNegative = 0.0  # between an answer and the next message

    @model_validator(mode="after")
    def _one_source(self):
        given = [key for key in ("turns", "message_len", "answer_len") if getattr(self, key) is not None]
        if self.path and given:
            raise ValueError(f"a ShareGPT file gives the turns and their lengths: leave out {', '.join(given)}")
        if not self.path and len(given) < 3:
            raise ValueError(f"workload={self.name} needs workload.path=<a ShareGPT JSON file>, or turns, "
                             "message_len and answer_len (synthetic conversations)")
        if self.max_prompt_len is not None or self.max_output_len is not None:
            raise ValueError("max_prompt_len and max_output_len would cut a conversation's history: limit "
                             "message_len, answer_len or turns instead")
        return self


TRACE_SOURCES = ("azure", "burstgpt", "mooncake")
ParsedWorkload = SyntheticWorkload | RandomWorkload | ShareGPTWorkload | TraceWorkload | ConversationWorkload
WorkloadConfig = Annotated[ParsedWorkload, Field(discriminator="source")]
_ADAPTER = TypeAdapter(WorkloadConfig)


def parse_workload(data) -> ParsedWorkload:
    """A workload config (a mapping, or an OmegaConf node) as its typed model; one `WorkloadError` if it is bad."""
    data = plain_config(data)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise WorkloadError(one_line(e, data, "workload")) from None


def plain_config(data):
    """Plain Python data from a config: an OmegaConf node resolved, a required value not given ("???") absent."""
    if hasattr(data, "_metadata"):  # an OmegaConf node
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(data, resolve=True)
    if isinstance(data, dict):
        return {k: plain_config(v) for k, v in data.items() if v != "???"}
    return data


def one_line(error: ValidationError, data, prefix: str = "") -> str:
    """The first problem of a validation error as one line naming the dotted key: `workload.rate should be
    greater than 0, got -1`. Union tags pydantic adds to the location (`sharegpt`, `fixed`) are left out, and a
    value that fits no member of a union says every form it may take: `should be 'auto' or a whole number >= 1`."""
    # An unknown key first (it explains the rest: a stale key of a replaced distribution), then the shallowest.
    problems = sorted(error.errors(), key=lambda p: (p["type"] != "extra_forbidden", len(p["loc"])))
    problem = problems[0]
    written, parent = _key_path(problem["loc"], data)
    key = [prefix, *written] if prefix else written
    name = ".".join(key).replace(".[", "[")
    message, kind = problem["msg"], problem["type"]
    # The members of a union the value fit none of: the same key, each member's own complaint.
    union = [p for p in problems if kind not in PLAIN_KINDS and p["type"] not in PLAIN_KINDS
             and _key_path(p["loc"], data)[0] == written]
    if kind == "missing":
        text = f"{'.'.join([*key, str(problem['loc'][-1])])} is required"
    elif kind == "extra_forbidden":
        where = ".".join(key[:-1]) or "the config"
        text = f"{name} is not a key of {where}"
        if isinstance(parent, dict) and "dist" in parent:
            text += f" (to change a distribution, replace it whole: {'.'.join(key[:-1])}={{dist: fixed, value: 100}})"
    elif kind in ("value_error", "assertion_error"):
        text = message.removeprefix("Value error, ")
        text = f"{name}: {text}" if name else text
    else:
        if len(union) > 1:  # literal choices first: `'auto' or a whole number >= 1`
            forms = sorted(dict.fromkeys(_form(p) for p in union), key=lambda form: not form.startswith("'"))
            text = f"{name} should be {' or '.join(forms)}"
        else:
            text = f"{name} {message.replace('Input should', 'should')}"
        got = problem.get("input")
        if not isinstance(got, dict | list) and not (isinstance(got, float) and math.isnan(got) and "nan" in text):
            text += f", got {got!r}"
    more = len(error.errors()) - max(len(union), 1)
    return text + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


# Complaints about a key itself (missing, unknown) or from a validator: never one member of a union's.
PLAIN_KINDS = ("missing", "extra_forbidden", "value_error", "assertion_error")


def _key_path(loc: tuple, data) -> tuple[list[str], object]:
    """The keys the user wrote along a pydantic location (union tags dropped), and the node holding the last."""
    key, node, parent = [], data, None
    for i, part in enumerate(loc):
        following = loc[i + 1] if i + 1 < len(loc) else None
        # A tag that is also a key name (`config` of `source: config`): the next part is this node's key instead.
        is_tag = isinstance(node, dict) and following in node and not (
            isinstance(node.get(part), dict) and following in node[part])
        if isinstance(node, dict) and part in node and not is_tag:
            key.append(str(part))
            node, parent = node[part], node
        elif isinstance(node, list) and isinstance(part, int):
            key.append(f"[{part}]")
            node = node[part] if part < len(node) else None
        # else: a union tag, not a key the user wrote
    return key, parent


# Pydantic's complaint → the form a value must take, for a union's "should be A or B".
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}


def _form(problem: dict) -> str:
    kind, ctx = problem["type"], problem.get("ctx", {})
    whole = "int" in str(problem["loc"][-1])
    if kind == "literal_error":
        return ctx["expected"]
    if kind in _BOUNDS:
        sign, bound = _BOUNDS[kind]
        return f"{'a whole number' if whole else 'a number'} {sign} {ctx[bound]}"
    if kind.startswith("int_"):
        return "a whole number"
    if kind.startswith("float_"):
        return "a number"
    return problem["msg"].removeprefix("Input should be ")
