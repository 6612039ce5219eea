"""ShareGPT conversations, sampled the way `vllm bench` does: first two turns as prompt and completion."""

import json
from collections import Counter

import numpy as np

from workloads.spec import WorkloadError, existing_file


def load_sharegpt_pairs(path: str, encode, rng: np.random.Generator, num_requests: int,
                        min_len: int, max_prompt_len: int, max_total_len: int) -> tuple[list, dict]:
    """Up to `num_requests` (prompt_ids, completion_len) pairs and counts of what was read and dropped why."""
    file = existing_file(path, "ShareGPT file")
    try:
        entries = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkloadError(f"ShareGPT file {path!r} is not valid JSON: {e}") from None
    if not isinstance(entries, list):
        raise WorkloadError(f"ShareGPT file {path!r}: expected a JSON list of conversations, got "
                            f"{type(entries).__name__}")
    dropped: Counter = Counter()
    pairs = []
    for index in rng.permutation(len(entries)):
        entry = entries[index]
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) and "value" in t for t in turns):
            raise WorkloadError(f"ShareGPT file {path!r}, entry {index}: expected "
                                "{'conversations': [{'from': ..., 'value': ...}, ...]}")
        if len(turns) < 2:
            dropped["fewer than two turns"] += 1
            continue
        prompt_ids = encode(str(turns[0]["value"]))
        completion_len = len(encode(str(turns[1]["value"])))
        if len(prompt_ids) < min_len or completion_len < min_len:
            dropped[f"prompt or completion under {min_len} tokens"] += 1
        elif len(prompt_ids) > max_prompt_len:
            dropped[f"prompt over {max_prompt_len} tokens"] += 1
        elif len(prompt_ids) + completion_len > max_total_len:
            dropped[f"prompt + completion over {max_total_len} tokens"] += 1
        else:
            pairs.append((prompt_ids, completion_len))
            if len(pairs) == num_requests:
                break
    info = {"conversations_read": len(entries), "dropped": dict(dropped)}
    if not pairs:
        reasons = "; ".join(f"{n} with {why}" for why, n in dropped.items()) or "the file is empty"
        raise WorkloadError(f"ShareGPT file {path!r}: no usable conversation among {len(entries)} ({reasons})")
    return pairs, info
