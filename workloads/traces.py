"""Public production traces: lengths and timestamps, no text. Each loader validates its file and names the row.

- Azure LLM inference traces 2023/2024: CSV `TIMESTAMP,ContextTokens,GeneratedTokens`.
- BurstGPT: CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
- Mooncake: JSONL, one `{"timestamp" (ms), "input_length", "output_length", "hash_ids"}` per line; each hash id
  names a 512-token block, so requests sharing leading hash ids share a prompt prefix.
"""

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workloads.spec import WorkloadError, existing_file

MOONCAKE_BLOCK_TOKENS = 512


@dataclass
class TraceRows:
    """A trace's requests in file order: lengths, arrival times (seconds, from the first) and prefix hashes."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    timestamps_s: np.ndarray
    hash_ids: list[list[int]] | None = None
    info: dict = field(default_factory=dict)


def _read_csv(path: str, columns: list[str]) -> pd.DataFrame:
    file = existing_file(path, "trace file")
    try:
        table = pd.read_csv(file, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise WorkloadError(f"trace file {path!r} is not a readable CSV: {e}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise WorkloadError(f"trace file {path!r} lacks column(s) {missing}; it has {list(table.columns)}")
    return table


def _column(table: pd.DataFrame, column: str, path: str, minimum: float, integer: bool = True) -> np.ndarray:
    """A numeric column, every value >= minimum (and whole, for counts); the first bad data row is named."""
    values = pd.to_numeric(table[column], errors="coerce")
    bad = values.isna() | (values < minimum)
    if integer:
        bad |= values != values.round()
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        kind = "an integer" if integer else "a number"
        raise WorkloadError(f"trace file {path!r}, data row {table.index[position] + 1}: {column} = "
                            f"{table[column].iloc[position]} is not {kind} >= {minimum}")
    return values.to_numpy(dtype=np.int64 if integer else float)


def _ordered_seconds(seconds: np.ndarray, path: str, index: pd.Index | None = None) -> np.ndarray:
    """Arrival times from the first request; a timestamp that goes back in time is an error."""
    backwards = np.flatnonzero(np.diff(seconds) < 0)
    if len(backwards):
        position = int(backwards[0]) + 1
        row = (index[position] if index is not None else position) + 1
        raise WorkloadError(f"trace file {path!r}, data row {row}: timestamp goes back in time "
                            f"({seconds[position]} after {seconds[position - 1]}); a trace must be time-ordered")
    return seconds - seconds[0] if len(seconds) else seconds


def _non_empty(rows: TraceRows, path: str, why: str = "") -> TraceRows:
    if len(rows.prompt_lens) == 0:
        raise WorkloadError(f"trace file {path!r}: zero requests{why}")
    return rows


def load_azure(path: str) -> TraceRows:
    table = _read_csv(path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    stamps = pd.to_datetime(table.TIMESTAMP, errors="coerce", format="mixed")
    if stamps.isna().any():
        row = int(np.flatnonzero(stamps.isna().to_numpy())[0])
        raise WorkloadError(f"trace file {path!r}, data row {row + 1}: TIMESTAMP {table.TIMESTAMP.iloc[row]!r} is "
                            "not a date and time")
    seconds = (stamps - stamps.min()).dt.total_seconds().to_numpy()
    return _non_empty(TraceRows(_column(table, "ContextTokens", path, 1), _column(table, "GeneratedTokens", path, 1),
                                _ordered_seconds(seconds, path)), path)


def load_burstgpt(path: str, model: str | None = None) -> TraceRows:
    table = _read_csv(path, ["Timestamp", "Model", "Request tokens", "Response tokens"])
    info = {"rows_read": len(table)}
    if model:
        table = table[table.Model == model]
        info["model_filter"] = model
    seconds = _ordered_seconds(_column(table, "Timestamp", path, 0, integer=False), path, table.index)
    prompts, outputs = _column(table, "Request tokens", path, 0), _column(table, "Response tokens", path, 0)
    # BurstGPT logs failed requests with zero response tokens: they are not servable requests.
    keep = (prompts > 0) & (outputs > 0)
    info["dropped"] = {"zero request or response tokens": int((~keep).sum())}
    why = f" after the model filter {model!r}" if model else ""
    return _non_empty(TraceRows(prompts[keep], outputs[keep], seconds[keep], info=info), path, why)


def load_mooncake(path: str) -> TraceRows:
    file = existing_file(path, "trace file")
    stamps, prompts, outputs, hashes = [], [], [], []
    for line_no, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            stamp, prompt, output = float(entry["timestamp"]), int(entry["input_length"]), int(entry["output_length"])
            hash_ids = [int(h) for h in entry.get("hash_ids", [])]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise WorkloadError(f"trace file {path!r}, line {line_no}: expected a JSON object with timestamp, "
                                f"input_length, output_length, hash_ids ({type(e).__name__}: {e})") from None
        if prompt < 1 or output < 1 or stamp < 0:
            raise WorkloadError(f"trace file {path!r}, line {line_no}: timestamp, input_length and output_length "
                                f"must be positive, got {stamp}, {prompt}, {output}")
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
