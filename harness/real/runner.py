"""The real runner: executes a `BatchPlan` on a transformers causal LM over the paged KV cache."""

import time

import torch

from harness.architecture import Architecture
from harness.core.kv_cache import BlockAllocator
from harness.core.runner import StepResult
from harness.real.attention import BatchMeta, register_paged_attention
from strategies import BatchPlan, Request, ScheduledChunk


class RealRunner:
    """Owns the cache tensors and the model. Greedy sampling; any Llama-family model works unchanged because
    attention is swapped in through `AttentionInterface`, not by editing the model."""

    measures_wall_time = True

    def __init__(self, model, allocator: BlockAllocator, keep_logits: bool = False, kernel_backend: str = "auto"):
        param = next(model.parameters())
        arch = Architecture.from_config(model.config, param.dtype.itemsize)
        self.device = param.device
        self.model = model
        self.allocator = allocator
        self.keep_logits = keep_logits
        self.kernel_backend = kernel_backend
        self.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        shape = (allocator.num_blocks, allocator.block_size, arch.num_kv_heads, arch.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=param.dtype, device=self.device),
             torch.zeros(shape, dtype=param.dtype, device=self.device))
            for _ in range(arch.num_layers)
        ]
        model.set_attn_implementation(register_paged_attention())

    def warm_up(self) -> None:
        """One ragged and one padded step on a throwaway request, so one-time set-up costs stay out of timings."""
        request = Request(request_id=-1, arrival_s=0.0, token_ids=list(range(8)), num_prompt_tokens=8,
                          max_new_tokens=1)
        self.allocator.allocate(request, request.num_tokens)
        for padded in (False, True):
            self.execute(BatchPlan(chunks=[ScheduledChunk(request, 0, request.num_tokens)], padded=padded))
        self.allocator.free(request)

    def execute(self, plan: BatchPlan) -> StepResult:
        """One forward pass. `duration_s` (the step's busy time) is the model's alone: the clock starts once the
        inputs are on the device and stops after the device has finished (the sampled tokens' copy to the host
        waits for it), so building inputs counts as the harness's own time."""
        build = self._padded_inputs if plan.padded else self._ragged_inputs
        input_ids, position_ids, meta, keep, sampling_rows = build(plan)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the inputs' copy is not the model's time
        start = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, position_ids=position_ids, batch_meta=meta, use_cache=False,
                                logits_to_keep=keep).logits
        # ragged: [1, num_sampling, V]; padded: [B, 1, V]
        logits = logits[0] if not plan.padded else logits[:, -1]
        chosen = [plan.chunks[i].request.request_id for i in sampling_rows]
        rows = logits if not plan.padded else logits[sampling_rows]
        tokens = rows.argmax(dim=-1).tolist()  # the one sync a step needs: the host copy of the sampled tokens
        duration = time.perf_counter() - start
        kept = {rid: row.float().cpu() for rid, row in zip(chosen, rows)} if self.keep_logits else {}
        return StepResult(sampled=dict(zip(chosen, tokens)), duration_s=duration, logits=kept)

    def _ragged_inputs(self, plan: BatchPlan):
        ids, positions, slots, cu_seqlens, seq_lens_k, tables, keep, sampling_rows = [], [], [], [0], [], [], [], []
        for i, chunk in enumerate(plan.chunks):
            request, end = chunk.request, chunk.start + chunk.num_tokens
            ids += request.token_ids[chunk.start:end]
            positions += range(chunk.start, end)
            slots += self.allocator.slots(request.request_id, chunk.start, end)
            cu_seqlens.append(cu_seqlens[-1] + chunk.num_tokens)
            seq_lens_k.append(end)
            tables.append(self.allocator.block_tables[request.request_id])
            if chunk.samples:
                keep.append(cu_seqlens[-1] - 1)
                sampling_rows.append(i)
        ids, positions, slots, cu_seqlens, seq_lens_k, keep, table = self._on_device(
            ids, positions, slots, cu_seqlens, seq_lens_k, keep, self._padded_table(tables))
        meta = BatchMeta(kv_caches=self.kv_caches, slot_mapping=slots, seq_lens_k=seq_lens_k,
                         block_table=table.view(len(tables), -1), padded=False, backend=self.kernel_backend,
                         cu_seqlens_q=cu_seqlens, max_seqlen_q=max(c.num_tokens for c in plan.chunks))
        return ids[None], positions[None], meta, keep, sampling_rows

    def _padded_inputs(self, plan: BatchPlan):
        width = plan.row_width
        # Rows as host lists, left-padded, then one copy for the whole step: a tensor per row would cost more
        # than the step's attention on a small model (and a host-to-device copy each on a GPU).
        ids, positions, slots, query_lens, seq_lens_k, tables, sampling_rows = [], [], [], [], [], [], []
        for b, chunk in enumerate(plan.chunks):
            request, n, end = chunk.request, chunk.num_tokens, chunk.start + chunk.num_tokens
            pad = width - n
            ids += [self.pad_token_id] * pad + request.token_ids[chunk.start:end]
            positions += [0] * pad + list(range(chunk.start, end))
            slots += [-1] * pad + self.allocator.slots(request.request_id, chunk.start, end)
            query_lens.append(n)
            seq_lens_k.append(end)
            tables.append(self.allocator.block_tables[request.request_id])
            if chunk.samples:
                sampling_rows.append(b)
        for request in plan.idle_rows:  # all padding, over its own rows
            ids += [self.pad_token_id] * width
            positions += [0] * width
            slots += [-1] * width
            query_lens.append(0)
            seq_lens_k.append(request.num_computed_tokens)
            tables.append(self.allocator.block_tables[request.request_id])
        ids, positions, slots, query_lens, seq_lens_k, keep, table = self._on_device(
            ids, positions, slots, query_lens, seq_lens_k, [width - 1], self._padded_table(tables))
        rows = len(query_lens)
        meta = BatchMeta(kv_caches=self.kv_caches, slot_mapping=slots, seq_lens_k=seq_lens_k,
                         block_table=table.view(rows, -1), padded=True, backend=self.kernel_backend,
                         query_lens=query_lens, max_seqlen_k=max(seq_lens_k))
        return ids.view(rows, width), positions.view(rows, width), meta, keep, sampling_rows  # [B, L] each

    def _on_device(self, *parts: list[int]) -> list[torch.Tensor]:
        """Several host lists of ints as device tensors, through one host buffer (pinned on a GPU) and one
        asynchronous copy: a step's inputs cost one transfer, not one per tensor."""
        sizes = [len(p) for p in parts]
        host = torch.tensor([x for p in parts for x in p], dtype=torch.long,
                            pin_memory=self.device.type == "cuda")
        return list(host.to(self.device, non_blocking=True).split(sizes))

    @staticmethod
    def _padded_table(tables: list[list[int]]) -> list[int]:
        """Block tables flattened row by row, each padded with -1 to the longest: `[S * max_blocks]`."""
        width = max(1, max(len(t) for t in tables))
        return [block for t in tables for block in (*t, *[-1] * (width - len(t)))]


def activation_peak_bytes(model, num_rows: int, row_tokens: int, padded: bool, block_size: int,
                          kernel_backend: str = "auto") -> int:
    """GPU memory a step of `num_rows` prompts of `row_tokens` tokens each (a padded rectangle, or ragged chunks)
    takes beyond the weights: its peak allocation in one forward pass over a throwaway cache just big enough, as vLLM
    profiles a step of its token budget before it sizes its cache. The model's attention is left as it was found."""
    attention = model.config._attn_implementation
    allocator = BlockAllocator(num_rows * -(-row_tokens // block_size), block_size)
    requests = [Request(request_id=-1 - i, arrival_s=0.0, token_ids=[0] * row_tokens, num_prompt_tokens=row_tokens,
                        max_new_tokens=1) for i in range(num_rows)]
    for request in requests:
        allocator.allocate(request, row_tokens)
    runner = RealRunner(model, allocator, kernel_backend=kernel_backend)
    torch.cuda.synchronize(runner.device)
    before = torch.cuda.memory_allocated(runner.device)  # the weights and the throwaway cache: not the step's
    torch.cuda.reset_peak_memory_stats(runner.device)
    runner.execute(BatchPlan(chunks=[ScheduledChunk(r, 0, row_tokens) for r in requests], padded=padded))
    peak = torch.cuda.max_memory_allocated(runner.device) - before
    del runner
    model.set_attn_implementation(attention)
    torch.cuda.empty_cache()
    return peak
