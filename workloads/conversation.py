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
from workloads.spec import CONVERSATION, SYSTEM_PROMPT, RequestSpec, Workload, fits_context, piece_key


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


def build_conversations(cfg: ConversationWorkload, vocab_size: int, max_model_len: int | None,
                        with_ids: bool) -> Workload:
    """`cfg.num_requests` turns of conversations started by the arrival process. A turn's prompt is the system
    prompt, every earlier message and answer, and its own message; its answer is as long as the workload says,
    and the next turn resends the answer the workload wrote (a real model's own words would differ; a
    simulation has none), so a prefix cache can reuse the previous turn's prompt, not its generated tokens."""
    n = cfg.num_requests
    rng = np.random.default_rng(cfg.seed)
    turns = sample_lengths(cfg.turns, n, rng)  # at most n conversations, each of at least one turn
    ends = np.cumsum(turns)
    num_conversations = int(np.searchsorted(ends, n)) + 1
    turns = turns[:num_conversations]
    turns[-1] -= int(ends[num_conversations - 1]) - n  # the last one is cut to make n turns
    starts = arrival_times(cfg.arrival, num_conversations, rng, cfg.rate, cfg.burstiness).tolist()
    message_lens = sample_lengths(cfg.message_len, n, rng).tolist()
    answer_lens = sample_lengths(cfg.answer_len, n, rng).tolist()
    system = system_prompt(cfg, vocab_size)
    context = max_model_len or np.iinfo(np.int64).max

    requests: list[RequestSpec] = []
    for c, num_turns in enumerate(turns.tolist()):
        pieces, ids = system.pieces, system.ids
        for t in range(num_turns):
            k = len(requests)
            message, answer = (CONVERSATION, cfg.seed, c, t, 0), (CONVERSATION, cfg.seed, c, t, 1)
            pieces += ((piece_key(*message), message_lens[k]),)
            prompt_len = sum(length for _, length in pieces)
            if with_ids:
                ids += piece_ids(message, message_lens[k], vocab_size)
            servable = with_ids and fits_context(prompt_len, answer_lens[k], context)
            requests.append(RequestSpec(
                request_id=k, arrival_s=starts[c], prompt_ids=ids if servable else (), max_new_tokens=answer_lens[k],
                prompt_len=prompt_len, prefix_pieces=pieces, follows=k - 1 if t else None, think_s=cfg.think_s))
            pieces += ((piece_key(*answer), answer_lens[k]),)
            if with_ids:
                ids += piece_ids(answer, answer_lens[k], vocab_size)
    info = {"source": f"conversations: {num_conversations}, {n} turns; each turn resends the conversation so far, "
                      f"the next {cfg.think_s:g} s after the answer"}
    beyond = sum(not fits_context(r.prompt_len, r.max_new_tokens, context) for r in requests)
    if beyond:
        info["beyond_context"] = f"{beyond} requests longer than the model's context"
    return Workload(name=cfg.name, requests=requests, info=info)
