"""Automatic prefix caching, as vLLM's V1 engine does it: a full block is named by a hash of its tokens chained to
the previous block's hash, so one name means one whole prefix. Requests that share a prefix share its blocks by
reference count; a block no request holds stays cached until the allocator hands it out again (`BlockAllocator`
decides in which order).

Every full computed block is named, generated tokens' too, so a preempted request finds all it had computed. A
request without token ids (a simulation) is named by the workload's `prefix_pieces` instead: the same piece key is
the same tokens in every request, and what follows the pieces, its output included, is its own.
"""

from strategies import Request

OWN_CONTENT = -1  # a piece key no workload uses: the rest of a request's tokens after its shared pieces


def prompt_block_hashes(request: Request, block_size: int) -> list[int]:
    """The chained hashes of `request`'s full prompt blocks (a router's and a trace's view: before it ran)."""
    return block_hashes(request, block_size, request.num_prompt_tokens // block_size)


def block_hashes(request: Request, block_size: int, num_blocks: int, known: list[int] | None = None) -> list[int]:
    """The chained hashes of `request`'s first `num_blocks` full blocks, prompt then output, from its token ids where
    it has them; `known`, the hashes of its leading blocks already named, is extended in place and returned."""
    hashes = [] if known is None else known
    parent = hashes[-1] if hashes else None
    ids = request.token_ids
    if len(ids) == request.num_tokens:  # the ids are known
        for i in range(len(hashes), num_blocks):
            parent = hash((parent, tuple(ids[i * block_size:(i + 1) * block_size])))
            hashes.append(parent)
        return hashes
    pieces, start = [], 0  # (key, first token, end) of each piece, in prompt positions
    for key, length in request.prefix_pieces:
        pieces.append((key, start, start + length))
        start += length
    for i in range(len(hashes), num_blocks):
        lo, hi = i * block_size, (i + 1) * block_size
        content = tuple((key, max(lo, s) - s, min(hi, e) - s) for key, s, e in pieces if s < hi and e > lo)
        if hi > start:  # past the shared pieces: this request's own tokens, and every block after too
            content += ((OWN_CONTENT, request.request_id),)
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Which physical blocks hold which named blocks, and how many requests hold each."""

    def __init__(self):
        self.block_of: dict[int, int] = {}  # hash → block
        self.hash_of: dict[int, int] = {}  # block → hash
        self.ref_counts: dict[int, int] = {}  # block → requests holding it
        self.num_evictions = 0

    def match(self, hashes: list[int]) -> list[int]:
        """The blocks of the longest leading run of `hashes` that is cached."""
        blocks = []
        for h in hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_reviving(self, blocks: list[int]) -> int:
        """How many of `blocks` no request holds: taking them uses up free blocks."""
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    def hold(self, block: int) -> bool:
        """One more request holds `block`; True if none did (it leaves the free blocks)."""
        self.ref_counts[block] += 1
        return self.ref_counts[block] == 1

    def add(self, block: int, block_hash: int) -> bool:
        """Name a freshly computed block, held by the request that computed it. False if another block already
        holds the same tokens (two requests computed one prefix at once): this one stays its request's own."""
        if block_hash in self.block_of:
            return False
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
        self.ref_counts[block] = 1
        return True

    def release(self, block: int) -> bool:
        """One request fewer holds `block`; True if none does now (it joins the free blocks, still named)."""
        self.ref_counts[block] -= 1
        return self.ref_counts[block] == 0

    def evict(self, block: int) -> None:
        """Forget the name of `block`, which no request holds: it is handed out for other tokens."""
        del self.block_of[self.hash_of.pop(block)]
        del self.ref_counts[block]
        self.num_evictions += 1

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_of)
