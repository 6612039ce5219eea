"""What a run records: every request that entered, and every step."""

from dataclasses import dataclass, field

from strategies import Request


@dataclass
class StepRecord:
    step: int
    start_s: float
    duration_s: float  # how far the clock moved: wall time of the whole step, or the predicted time
    busy_s: float  # time inside the model or the cost model
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    num_rows: int  # sequences (ragged) or rectangle rows (padded)
    row_width: int  # padded rectangle width; 0 for ragged
    num_preempted: int
    num_waiting: int
    num_seqs: int  # requests with tokens in this step
    kv_used_blocks: int


@dataclass
class RunRecords:
    requests: list[Request] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
