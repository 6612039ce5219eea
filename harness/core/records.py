"""What a run records: every request that entered, every step (as columns), and the inter-token gaps the
simulator keeps per step instead of per token."""

from array import array
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from strategies import Request

# Each step's columns and their typecodes: one machine word per value, so millions of steps stay small.
STEP_COLUMNS = {
    "step": "q",
    "start_s": "d",
    "duration_s": "d",  # how far the clock moved: wall time of the whole step, or the predicted time
    "busy_s": "d",  # time inside the model or the cost model
    "num_prefill_tokens": "q",
    "num_decode_tokens": "q",
    "num_padding_tokens": "q",
    "num_rows": "q",  # sequences (ragged) or rectangle rows (padded)
    "row_width": "q",  # padded rectangle width; 0 for ragged
    "num_preempted": "q",
    "num_waiting": "q",
    "num_seqs": "q",  # requests with tokens in this step
    "kv_used_blocks": "q",
    "num_lookup_tokens": "q",  # tokens of the requests admitted this step (each looks its prompt up in the cache)
    "num_cached_tokens": "q",  # of those, found in the prefix cache
    "kv_cached_blocks": "q",  # named blocks the prefix cache keeps at the step's end, held by requests or not
}
_DTYPES = {"q": np.int64, "d": np.float64}


class StepLog:
    """One growing column per field of a step. `append` takes one step, `extend` a run of them as arrays."""

    def __init__(self):
        self._columns = {name: array(code) for name, code in STEP_COLUMNS.items()}

    def __len__(self) -> int:
        return len(self._columns["step"])

    def append(self, **row) -> None:
        for name, column in self._columns.items():
            column.append(row[name])

    def extend(self, **columns) -> None:
        """Steps given column by column (numpy arrays of one length, or scalars repeated over it). A low load's
        stretches are a few steps each, many of them: scalars build no array, and no numpy function is called on
        one (each costs a microsecond)."""
        n = max((len(v) for v in columns.values() if _is_array(v)), default=1)
        for name, column in self._columns.items():
            values = columns[name]
            if _is_array(values):
                column.frombytes(np.ascontiguousarray(values, dtype=_DTYPES[STEP_COLUMNS[name]]).tobytes())
            else:
                column.extend(array(column.typecode, (values,)) * n)

    def column(self, name: str) -> np.ndarray:
        """A read-only view of one column."""
        return np.frombuffer(self._columns[name], dtype=_DTYPES[STEP_COLUMNS[name]])

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({name: self.column(name).copy() for name in self._columns})


def _is_array(values) -> bool:
    return isinstance(values, np.ndarray) and values.ndim > 0


@dataclass
class RunRecords:
    requests: list[Request] = field(default_factory=list)
    steps: StepLog = field(default_factory=StepLog)
    # The simulated engine's inter-token gaps: at step i, `gaps_per_step[i]` requests got a token one step after
    # their previous one (a gap of end[i] - end[i-1]); `other_gaps` are the rest, one value each, but for a gap many
    # requests had at once (the decoders a prefill-only step paused, SGLang's schedule): `shared_gaps`, each
    # `shared_gap_counts` times. Step-by-step engines and peers keep each request's `token_times_s` instead.
    gaps_per_step: array = field(default_factory=lambda: array("q"))
    other_gaps: array = field(default_factory=lambda: array("d"))
    shared_gaps: array = field(default_factory=lambda: array("d"))
    shared_gap_counts: array = field(default_factory=lambda: array("q"))
