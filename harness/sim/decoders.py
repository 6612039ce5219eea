"""The running requests that decode one token at every step, kept as aggregates so a step costs what changed.

A member that joined at step `s0` with `c0` computed tokens has `base + s` computed when step `s` starts
(`base = c0 - s0`), without being touched in between. So a step over the set reads `sum(base) + n (s + 1)`
cached keys, its longest row has `max(base) + s + 1`, a member needs a new cache block at step `s` when
`(base + s) % block_size == 0` (one group per residue), and it finishes after step
`max_new_tokens + prompt - 2 - base` (`last`; its output still to come when step `s` starts is `last + 1 - s`).
Joining and leaving are O(1) (O(log n) for the longest row).
"""

import heapq
from collections import defaultdict

import numpy as np

from strategies import Request


class DecodeSet:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.base: dict[int, int] = {}  # request_id → computed tokens at step 0, were it a member all along
        self.sum_base = 0
        self.sum_last = 0  # of the members' last steps
        # request_id → request, by the residue of -base: the members that need a block at steps s ≡ residue.
        self._by_phase: list[dict[int, Request]] = [{} for _ in range(block_size)]
        self._finishing: dict[int, dict[int, Request]] = defaultdict(dict)  # step → members done after it
        self._finish_steps: list[int] = []  # min-heap of the keys of `_finishing`, stale ones skipped
        # By sign: a heap of (sign x base, request_id), the longest member first (-1) or the shortest (+1), stale
        # entries skipped; built when first asked for (padded batching asks for the longest, continuous batching
        # over window layers for the shortest) and rebuilt when mostly stale.
        self._rows: dict[int, list[tuple[int, int]]] = {}
        # The members' full blocks once step `_full_step` has run, kept as they join and leave and moved on by
        # `num_full_blocks`: a member fills a block every block_size steps, at the steps its residue says.
        self._full_blocks = 0
        self._full_step = 0

    def __len__(self) -> int:
        return len(self.base)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self.base

    def join(self, request: Request, step: int, num_computed: int) -> None:
        """`request` decodes from `step` on, with `num_computed` tokens cached (all but its last)."""
        rid = request.request_id
        base = num_computed - step
        self.base[rid] = base
        self.sum_base += base
        self._full_blocks += (base + self._full_step + 1) // self.block_size
        self._by_phase[-base % self.block_size][rid] = request
        last = self._last_step(request, base)
        self.sum_last += last
        if last not in self._finishing:
            heapq.heappush(self._finish_steps, last)
        self._finishing[last][rid] = request
        for sign, heap in list(self._rows.items()):
            if len(heap) > 2 * len(self.base):
                del self._rows[sign]
            else:
                heapq.heappush(heap, (sign * base, rid))

    def leave(self, request: Request, step: int) -> int:
        """Remove `request` before `step` runs; returns its computed tokens then."""
        rid = request.request_id
        base = self.base.pop(rid)
        self.sum_base -= base
        self._full_blocks -= (base + self._full_step + 1) // self.block_size
        del self._by_phase[-base % self.block_size][rid]
        last = self._last_step(request, base)
        self.sum_last -= last
        del self._finishing[last][rid]
        if not self._finishing[last]:
            del self._finishing[last]
        return base + step

    @staticmethod
    def _last_step(request: Request, base: int) -> int:
        # After step s a member holds base + s + 2 tokens, prompt included.
        return request.num_prompt_tokens + request.max_new_tokens - 2 - base

    def phase_sizes(self) -> list[int]:
        """How many members need a block at steps s with s % block_size == i, for each i."""
        return [len(group) for group in self._by_phase]

    def crossing(self, step: int) -> list[Request]:
        """Members that need a new block to decode at `step`."""
        return list(self._by_phase[step % self.block_size].values())

    def finishing(self, step: int) -> list[Request]:
        """Members whose last token comes from `step`; they leave the set."""
        done = self._finishing.pop(step, None)
        if not done:
            return []
        self.sum_last -= step * len(done)
        for rid in done:
            base = self.base.pop(rid)
            self.sum_base -= base
            self._full_blocks -= (base + self._full_step + 1) // self.block_size
            del self._by_phase[-base % self.block_size][rid]
        return list(done.values())

    def keys_read(self, step: int) -> int:
        """Cached keys the members' decode tokens attend to at `step` (their own new key included)."""
        return self.sum_base + len(self.base) * (step + 1)

    def num_full_blocks(self, step):
        """Full blocks the members' tokens fill once `step` (an int, or an array of consecutive steps) has run:
        each has `base + step + 1` computed then."""
        size = self.block_size
        if isinstance(step, np.ndarray):  # a stretch: from its first step on, the members filling a block at each
            filling = np.array(self.phase_sizes())[(step[1:] + 1) % size]  # [N - 1]
            return self.num_full_blocks(int(step[0])) + np.concatenate(([0], np.cumsum(filling)))
        delta = step - self._full_step
        if delta == 1:  # the common case: the next step
            self._full_blocks += len(self._by_phase[(step + 1) % size])
        elif delta < 0:  # a step already passed: counted afresh
            self._full_blocks = sum((base + step + 1) // size for base in self.base.values())
        else:  # every member fills one block in each block_size steps; the rest, step by step
            periods, rest = divmod(delta, size)
            self._full_blocks += periods * len(self.base)
            for t in range(step - rest + 1, step + 1):
                self._full_blocks += len(self._by_phase[(t + 1) % size])
        self._full_step = step
        return self._full_blocks

    def longest_row(self, step: int) -> int:
        """Keys of the longest member's row at `step` (0 with no member)."""
        return self._row(-1, step)

    def shortest_row(self, step: int) -> int:
        """Keys of the shortest member's row at `step` (0 with no member)."""
        return self._row(1, step)

    def _row(self, sign: int, step: int) -> int:
        heap = self._rows.get(sign)
        if heap is None:
            heap = self._rows[sign] = [(sign * base, rid) for rid, base in self.base.items()]
            heapq.heapify(heap)
        while heap and self.base.get(heap[0][1]) != sign * heap[0][0]:
            heapq.heappop(heap)
        return sign * heap[0][0] + step + 1 if heap else 0

    def next_finish(self) -> int | None:
        """The first step after which a member finishes."""
        heap = self._finish_steps
        while heap and heap[0] not in self._finishing:
            heapq.heappop(heap)
        return heap[0] if heap else None
