"""ShareGPT conversations: sampled the way `vllm bench` does (first two turns as prompt and completion), or whole,
turn by turn, for multi-turn replay."""

import json
from collections import Counter

import numpy as np

from workloads.spec import WorkloadError, existing_file


def _entries(path: str) -> list:
    file = existing_file(path, "ShareGPT file")
    try:
        entries = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkloadError(f"ShareGPT file {path!r} is not valid JSON: {e}") from None
    if not isinstance(entries, list):
        raise WorkloadError(f"ShareGPT file {path!r}: expected a JSON list of conversations, got "
                            f"{type(entries).__name__}")
    return entries


def _turns(entries: list, index: int, path: str) -> list[dict]:
    entry = entries[index]
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list) or not all(isinstance(t, dict) and "value" in t for t in turns):
        raise WorkloadError(f"ShareGPT file {path!r}, entry {index}: expected "
                            "{'conversations': [{'from': ..., 'value': ...}, ...]}")
    return turns


def load_sharegpt_conversations(path: str, encode, rng: np.random.Generator,
                                num_turns: int) -> tuple[list[tuple[int, list[tuple[list[int], list[int]]]]], dict]:
    """Whole conversations, in a seeded order, until they hold `num_turns` turns: (entry index, [(message ids,
    answer ids), ...]), each turn a human message and the answer after it, from the start of the conversation to
    its first message without an answer. Counts of what was read and dropped why."""
    entries = _entries(path)
    dropped: Counter = Counter()
    conversations, total = [], 0
    for index in rng.permutation(len(entries)):
        turns = _turns(entries, int(index), path)
        pairs = []
        for message, answer in zip(turns[::2], turns[1::2]):
            if message.get("from") != "human" or answer.get("from") != "gpt":
                break
            message_ids, answer_ids = encode(str(message["value"])), encode(str(answer["value"]))
            if not message_ids or not answer_ids:
                break
            pairs.append((message_ids, answer_ids))
        if not pairs:
            dropped["no human message with an answer"] += 1
            continue
        conversations.append((int(index), pairs))
        total += len(pairs)
        if total >= num_turns:
            break
    info = {"conversations_read": len(entries), "dropped": dict(dropped)}
    if not conversations:
        raise WorkloadError(f"ShareGPT file {path!r}: no conversation with a human message and its answer among "
                            f"{len(entries)}")
    return conversations, info


def load_sharegpt_pairs(path: str, encode, rng: np.random.Generator, num_requests: int,
                        min_len: int, max_prompt_len: int, max_total_len: int) -> tuple[list, dict]:
    """Up to `num_requests` (prompt_ids, completion_len) pairs and counts of what was read and dropped why."""
    entries = _entries(path)
    dropped: Counter = Counter()
    pairs = []
    for index in rng.permutation(len(entries)):
        turns = _turns(entries, int(index), path)
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
