"""Prompts that share what came before: a system prompt any workload may start with, and multi-turn
conversations whose every turn resends the conversation so far.

A shared part is a piece (`RequestSpec.prefix_pieces`): its key names its tokens, which are drawn from a generator
seeded by the key alone, so every request that names a piece holds the same ids, and a simulation (which keeps no
ids) still knows which requests share which tokens.
"""

from dataclasses import dataclass

import numpy as np

from workloads.arrivals import arrival_times
from workloads.config import ConversationWorkload
from workloads.lengths import sample_lengths
from workloads.sharegpt import load_sharegpt_conversations
from workloads.spec import CONVERSATION, SYSTEM_PROMPT, RequestSpec, Workload, fits_context, piece_key
from workloads.tokenizer import text_encoder


@dataclass(frozen=True)
class SharedText:
    """Tokens every request of a workload starts with, as pieces and (where ids are built) ids."""

    pieces: tuple[tuple[int, int], ...] = ()
    ids: tuple[int, ...] = ()

    def __len__(self) -> int:
        return sum(length for _, length in self.pieces)


def piece_ids(key_parts: tuple[int, ...], length: int, vocab_size: int) -> tuple[int, ...]:
    """The ids of a piece: the same parts, the same ids, whichever request (or process) draws them."""
    return tuple(np.random.default_rng(list(key_parts)).integers(0, vocab_size, size=length).tolist())


def system_prompt(cfg, vocab_size: int) -> SharedText:
    """`workload.system_prompt_len` tokens of one system prompt, the same for every request."""
    length = cfg.system_prompt_len
    if not length:
        return SharedText()
    parts = (SYSTEM_PROMPT, cfg.seed)
    return SharedText(((piece_key(*parts), length),), piece_ids(parts, length, vocab_size))


def build_conversations(cfg: ConversationWorkload, vocab_size: int, max_model_len: int | None, with_ids: bool,
                        hf_tokenizer=None) -> Workload:
    """`cfg.num_requests` turns of conversations started by the arrival process. A turn's prompt is the system
    prompt, every earlier message and answer, and its own message; its output is as long as its answer. The next
    turn resends the answer the workload holds (ShareGPT's own, or synthetic ids; a real model's words would
    differ and a simulation has none), so a prefix cache can reuse the previous turn's prompt, not its generated
    tokens."""
    n = cfg.num_requests
    rng = np.random.default_rng(cfg.seed)
    conversations, info = _sharegpt(cfg, vocab_size, hf_tokenizer, rng) if cfg.path else _synthetic(cfg, rng)
    starts = arrival_times(cfg.arrival, len(conversations), rng, cfg.rate, cfg.burstiness).tolist()
    if not cfg.path:  # drawn after the arrivals, as they always were: the same seed, the same workload
        lengths = iter(zip(sample_lengths(cfg.message_len, n, rng).tolist(),
                           sample_lengths(cfg.answer_len, n, rng).tolist()))
        conversations = [(c, [(*next(lengths), None, None) for _ in turns]) for c, turns in conversations]
    system = system_prompt(cfg, vocab_size)
    context = max_model_len or np.iinfo(np.int64).max

    requests: list[RequestSpec] = []
    for start_s, (c, turns) in zip(starts, conversations):
        pieces, ids = system.pieces, system.ids
        for t, (message_len, answer_len, message_ids, answer_ids) in enumerate(turns):
            k = len(requests)
            message, answer = (CONVERSATION, cfg.seed, c, t, 0), (CONVERSATION, cfg.seed, c, t, 1)
            pieces += ((piece_key(*message), message_len),)
            prompt_len = sum(length for _, length in pieces)
            if with_ids:
                ids += message_ids or piece_ids(message, message_len, vocab_size)
            servable = with_ids and fits_context(prompt_len, answer_len, context)
            requests.append(RequestSpec(
                request_id=k, arrival_s=start_s, prompt_ids=ids if servable else (), max_new_tokens=answer_len,
                prompt_len=prompt_len, prefix_pieces=pieces, follows=k - 1 if t else None, think_s=cfg.think_s))
            pieces += ((piece_key(*answer), answer_len),)
            if with_ids:
                ids += answer_ids or piece_ids(answer, answer_len, vocab_size)
    info["source"] = (f"{info['source']}: {len(conversations)} conversations, {n} turns; each turn resends the "
                      f"conversation so far, the next {cfg.think_s:g} s after the answer")
    beyond = sum(not fits_context(r.prompt_len, r.max_new_tokens, context) for r in requests)
    if beyond:
        info["beyond_context"] = f"{beyond} requests longer than the model's context"
    return Workload(name=cfg.name, requests=requests, info=info)


def _synthetic(cfg: ConversationWorkload, rng: np.random.Generator) -> tuple[list, dict]:
    """As many conversations as `num_requests` turns take (the last cut short): (index, [None] * its turns)."""
    n = cfg.num_requests
    turns = sample_lengths(cfg.turns, n, rng)  # at most n conversations, each of at least one turn
    ends = np.cumsum(turns)
    count = int(np.searchsorted(ends, n)) + 1
    turns = turns[:count]
    turns[-1] -= int(ends[count - 1]) - n
    return [(c, [None] * int(t)) for c, t in enumerate(turns)], {"source": "synthetic conversations"}


def _sharegpt(cfg: ConversationWorkload, vocab_size: int, hf_tokenizer, rng: np.random.Generator) -> tuple[list, dict]:
    """ShareGPT's conversations, turn by turn, up to `num_requests` turns: (entry, [(message tokens, answer tokens,
    message ids, answer ids), ...])."""
    encode, tokenizer_name = text_encoder(vocab_size, hf_tokenizer)
    read, info = load_sharegpt_conversations(cfg.path, encode, rng, cfg.num_requests)
    conversations, left = [], cfg.num_requests
    for index, pairs in read:
        turns = [(len(m), len(a), tuple(m), tuple(a)) for m, a in pairs[:left]]
        conversations.append((index, turns))
        left -= len(turns)
    if left:
        info["note"] = f"asked for {cfg.num_requests} turns, the file's conversations have {cfg.num_requests - left}"
    return conversations, {"source": f"ShareGPT file {cfg.path}", "tokenizer": tokenizer_name, **info}
