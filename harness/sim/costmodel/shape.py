"""A step's shape: the few numbers its cost depends on, computed in O(chunks) from its plan."""

from dataclasses import dataclass

from strategies import BatchPlan


# Not frozen: a replay builds one a step, and a frozen dataclass's __init__ costs some four times a plain one's.
@dataclass(slots=True)
class StepShape:
    padded: bool
    num_tokens: int  # token slots the model computes, padding included
    num_rows: int  # sequences (ragged) or rectangle rows (padded)
    attention_pairs: int  # query-key pairs attention computes: sum q*k (ragged), rows*width*k_max (padded)
    kv_tokens_read: int  # cached tokens read: sum k (ragged), rows*k_max (padded)
    num_sampled: int  # positions that go through the LM head
    decode_pairs: int = 0  # the query-key pairs of rows computing one token (MLA attends to them differently)
    # Of `attention_pairs`, those where a prompt chunk's query precedes its key (q(q-1)/2 a chunk of q): the causal
    # mask hides them, and a causal kernel (FlashAttention) skips their blocks rather than computing them.
    masked_pairs: int = 0

    @property
    def mean_context(self) -> float:
        """Keys per computed token: the attention work per token."""
        return self.attention_pairs / self.num_tokens


def step_shape(plan: BatchPlan) -> StepShape:
    num_sampled = 0
    if plan.padded:
        k_max = 0
        for chunk in plan.chunks:
            k_max = max(k_max, chunk.start + chunk.num_tokens)
            num_sampled += chunk.samples
        rows, width = plan.num_rows, plan.row_width
        pairs = rows * width * k_max
        return StepShape(True, rows * width, rows, pairs, rows * k_max, rows, pairs if width == 1 else 0)
    tokens = pairs = read = decode = masked = 0
    for chunk in plan.chunks:
        k_len = chunk.start + chunk.num_tokens
        tokens += chunk.num_tokens
        pairs += chunk.num_tokens * k_len
        masked += chunk.num_tokens * (chunk.num_tokens - 1) // 2
        read += k_len
        num_sampled += chunk.samples
        decode += k_len if chunk.num_tokens == 1 else 0
    return StepShape(False, tokens, len(plan.chunks), pairs, read, num_sampled, decode, masked)
