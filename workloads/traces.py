"""Public production traces: lengths and timestamps, no text. Each loader validates its file and names the row.

- Azure LLM inference traces 2023/2024: CSV `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP a date and time,
  or a number in the unit given by `workload.timestamp_unit`.
- BurstGPT: CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; Timestamp in seconds.
- Mooncake: JSONL, one `{"timestamp" (ms), "input_length", "output_length", "hash_ids"}` per line; each hash id
  names a 512-token block, so requests sharing leading hash ids share a prompt prefix.

Every value must be finite; token counts whole and positive; timestamps time-ordered and within a decade.
"""

import json
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a CSV is read: a run that reads none starts half a second sooner
    import pandas as pd

from workloads.spec import MAX_SPAN_S, WorkloadError, existing_file

MOONCAKE_BLOCK_TOKENS = 512
UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass
class TraceRows:
    """A trace's requests in file order: lengths, arrival times (seconds, from the first) and prefix hashes."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    timestamps_s: np.ndarray
    hash_ids: list[list[int]] | None = None
    info: dict = field(default_factory=dict)


def _read_csv(path: str, columns: list[str], max_rows: int | None = None) -> "pd.DataFrame":
    """The file (its first `max_rows` data rows if given), which must have `columns`. Every column is parsed:
    reading only some would hide rows with more fields than the header."""
    import pandas as pd

    file = existing_file(path, "trace file")
    try:
        with warnings.catch_warnings():
            # Rows longer than the header would otherwise shift every column by one without a word.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            table = pd.read_csv(file, skipinitialspace=True, index_col=False, nrows=max_rows)
    except pd.errors.ParserWarning:
        raise WorkloadError(f"trace file {path!r}: its rows have more fields than its header") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise WorkloadError(f"trace file {path!r} is not a readable CSV: {str(e).strip()}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise WorkloadError(f"trace file {path!r} lacks column(s) {missing}; it has {list(table.columns)}")
    if table.empty:
        raise WorkloadError(f"trace file {path!r}: zero requests (a header and no rows)")
    return table


def _column(table: "pd.DataFrame", column: str, path: str, minimum: float, integer: bool = True) -> np.ndarray:
    """A numeric column, every value finite and >= minimum (and whole, for counts); the first bad row is named."""
    import pandas as pd

    values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < minimum)
    if integer:
        bad |= values != np.round(values)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        kind = "a whole number" if integer else "a finite number"
        raise WorkloadError(f"trace file {path!r}, data row {table.index[position] + 1}: {column} = "
                            f"{table[column].iloc[position]} is not {kind} >= {minimum:g}")
    return values.astype(np.int64) if integer else values


def _ordered_seconds(seconds: np.ndarray, path: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Arrival times from the first request; going back in time, or spanning more than a decade, is an error.
    `rows` are the data-row numbers of `seconds` (after a filter), for the message."""
    rows = np.arange(1, len(seconds) + 1) if rows is None else rows
    backwards = np.flatnonzero(np.diff(seconds) < 0)
    if len(backwards):
        i = int(backwards[0]) + 1
        raise WorkloadError(f"trace file {path!r}, data row {rows[i]}: timestamp goes back in time "
                            f"({seconds[i]} after {seconds[i - 1]}); a trace must be time-ordered")
    if len(seconds) == 0:
        return seconds
    relative = seconds - seconds[0]
    too_far = np.flatnonzero(relative > MAX_SPAN_S)
    if len(too_far):
        i = int(too_far[0])
        raise WorkloadError(f"trace file {path!r}, data row {rows[i]}: timestamp {seconds[i]:g} s is more than ten "
                            "years after the first; check the timestamps' unit")
    return relative


def _non_empty(rows: TraceRows, path: str, why: str = "") -> TraceRows:
    if len(rows.prompt_lens) == 0:
        raise WorkloadError(f"trace file {path!r}: zero requests{why}")
    return rows


def _azure_seconds(table: "pd.DataFrame", path: str, unit: str | None) -> np.ndarray:
    import pandas as pd

    stamps = table.TIMESTAMP
    if pd.api.types.is_numeric_dtype(stamps):
        if unit is None:
            raise WorkloadError(f"trace file {path!r}: TIMESTAMP holds numbers; say their unit with "
                                "workload.timestamp_unit=s|ms|us|ns")
        return _column(table, "TIMESTAMP", path, 0, integer=False) * UNIT_SECONDS[unit]
    try:
        try:  # ISO 8601, as Azure writes them: parsed in C, a million rows in a second
            parsed = pd.to_datetime(stamps, format="ISO8601")
        except ValueError:  # anything else is tried row by row
            parsed = pd.to_datetime(stamps, errors="coerce", format="mixed")
    except ValueError as e:  # mixed time-zone offsets, say: the order of the rows is not defined
        raise WorkloadError(f"trace file {path!r}: TIMESTAMP cannot be read as one time line ({e})") from None
    if parsed.isna().any():
        row = int(np.flatnonzero(parsed.isna().to_numpy())[0])
        raise WorkloadError(f"trace file {path!r}, data row {row + 1}: TIMESTAMP {stamps.iloc[row]!r} is not a date "
                            "and time")
    return (parsed - parsed.iloc[0]).dt.total_seconds().to_numpy()


def load_azure(path: str, timestamp_unit: str | None = None, max_rows: int | None = None) -> TraceRows:
    table = _read_csv(path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], max_rows)
    seconds = _ordered_seconds(_azure_seconds(table, path, timestamp_unit), path)
    return _non_empty(TraceRows(_column(table, "ContextTokens", path, 1), _column(table, "GeneratedTokens", path, 1),
                                seconds), path)


def load_burstgpt(path: str, model: str | None = None) -> TraceRows:
    table = _read_csv(path, ["Timestamp", "Model", "Request tokens", "Response tokens"])
    info = {"rows_read": len(table)}
    if model:
        table = table[table.Model == model]
        info["model_filter"] = model
    rows = table.index.to_numpy() + 1
    seconds = _ordered_seconds(_column(table, "Timestamp", path, 0, integer=False), path, rows)
    prompts, outputs = _column(table, "Request tokens", path, 0), _column(table, "Response tokens", path, 0)
    # BurstGPT logs failed requests with zero response tokens: they are not servable requests.
    keep = (prompts > 0) & (outputs > 0)
    info["dropped"] = {"zero request or response tokens": int((~keep).sum())}
    why = f" after the model filter {model!r}" if model else ""
    return _non_empty(TraceRows(prompts[keep], outputs[keep], seconds[keep], info=info), path, why)


def _whole(value, name: str, minimum: int) -> int:
    """A JSON count: an integer (not 70.9, not true) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} = {value!r} is not a whole number >= {minimum}")
    return value


def load_mooncake(path: str) -> TraceRows:
    file = existing_file(path, "trace file")
    stamps, prompts, outputs, hashes = [], [], [], []
    for line_no, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            stamp = entry["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0:
                raise ValueError(f"timestamp = {stamp!r} is not a finite number >= 0")
            prompt = _whole(entry["input_length"], "input_length", 1)
            output = _whole(entry["output_length"], "output_length", 1)
            hash_ids = [_whole(h, "a hash id", 0) for h in entry.get("hash_ids", [])]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise WorkloadError(f"trace file {path!r}, line {line_no}: expected a JSON object with timestamp, "
                                f"input_length, output_length, hash_ids ({type(e).__name__}: {e})") from None
        except ValueError as e:
            raise WorkloadError(f"trace file {path!r}, line {line_no}: {e}") from None
        stamps.append(stamp / 1000.0)
        prompts.append(prompt)
        outputs.append(output)
        hashes.append(hash_ids)
    return _non_empty(TraceRows(np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64),
                                _ordered_seconds(np.array(stamps), path), hash_ids=hashes), path)


def prefix_prompt_ids(hash_ids: list[int], length: int, vocab_size: int, seed: int,
                      rng: np.random.Generator) -> list[int]:
    """Prompt ids where each hash id's 512-token block is the same in every request that names it."""
    ids: list[int] = []
    for h in hash_ids:
        if len(ids) >= length:
            break
        ids += np.random.default_rng([seed, h]).integers(0, vocab_size, MOONCAKE_BLOCK_TOKENS).tolist()
    if len(ids) < length:  # more tokens than the hashes cover: the rest is this request's own
        ids += rng.integers(0, vocab_size, length - len(ids)).tolist()
    return ids[:length]
