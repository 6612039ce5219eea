"""transformers `generate()` on left-padded batches: static batching as users write it today.

The peer runs on the same virtual clock as our engines (a batch's `generate()` call moves it by its wall time;
an idle peer jumps to the next arrival), so the replay loop drives it as it drives them. Up to `batch_size`
waiting requests start together, left-padded to the longest prompt, and decode to the longest output; nothing
joins until the call returns. Each request keeps its own first `max_new_tokens` tokens, stamped with the time of
the decoding step that produced them.
"""

import time
from collections import deque

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from harness.core.engine import context_overflow, request_for
from harness.core.records import RunRecords
from strategies import Request, RequestStatus
from workloads import RequestSpec


class StepTimes(StoppingCriteria):
    """Stops nothing; records when each decoding step's tokens exist (it runs right after they are appended)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class GenerateBatches:
    name = "hf_generate"

    def __init__(self, model, batch_size: int, max_model_len: int, pad_token_id: int = 0):
        self.model = model
        self.batch_size = batch_size
        self.max_model_len = max_model_len
        self.pad_token_id = pad_token_id
        self.clock = 0.0
        self.waiting: deque[Request] = deque()
        self.records = RunRecords()
        self.num_output_tokens = 0
        self.num_done = 0
        self.on_done = None

    def warm_up(self) -> None:
        """One short call, so one-time set-up costs stay out of timings (as our runner's warm-up)."""
        with torch.inference_mode():
            self.model.generate(input_ids=torch.tensor([[1, 2, 3, 4]], device=self.model.device),
                                generation_config=GenerationConfig(do_sample=False, max_new_tokens=2,
                                                                   eos_token_id=None, pad_token_id=self.pad_token_id))

    @property
    def has_work(self) -> bool:
        return bool(self.waiting)

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting)

    def add_request(self, spec: RequestSpec, sent_s: float | None = None) -> Request:
        request = request_for(spec, sent_s)
        self.records.requests.append(request)
        request.reject_reason = context_overflow(spec, self.max_model_len)
        if request.reject_reason is None:
            self.waiting.append(request)
        else:
            request.status = RequestStatus.REJECTED
            self._done(request, request.sent_s)
        return request

    def step(self, arrivals=None) -> None:
        """One `generate()` call over the next batch, start to finish."""
        batch = [self.waiting.popleft() for _ in range(min(self.batch_size, len(self.waiting)))]
        longest_output = max(r.max_new_tokens for r in batch)
        ids, mask = self._left_padded(batch)
        timer = StepTimes()
        config = GenerationConfig(do_sample=False, max_new_tokens=longest_output, eos_token_id=None,
                                  pad_token_id=self.pad_token_id)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      stopping_criteria=StoppingCriteriaList([timer]))
        out = out.tolist()  # [B, L + longest_output]; the host copy also waits for the device
        duration = time.perf_counter() - start
        width = ids.shape[1]
        for row, request in enumerate(batch):
            request.first_scheduled_s = self.clock
            request.token_ids.extend(out[row][width:width + request.max_new_tokens])
            request.num_output_tokens = request.max_new_tokens
            request.token_times_s = [self.clock + t - start for t in timer.times[:request.max_new_tokens]]
            request.first_token_s = request.token_times_s[0]
            request.status = RequestStatus.FINISHED
            request.finish_s = request.token_times_s[-1]
            self.num_output_tokens += request.max_new_tokens
        self.clock += duration
        for request in batch:
            self._done(request, request.finish_s)

    def _left_padded(self, batch: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(r.num_prompt_tokens for r in batch)
        ids = [[self.pad_token_id] * (width - r.num_prompt_tokens) + r.token_ids for r in batch]
        mask = [[0] * (width - r.num_prompt_tokens) + [1] * r.num_prompt_tokens for r in batch]
        device = self.model.device
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device)  # [B, L] each

    def _done(self, request: Request, time_s: float) -> None:
        self.num_done += 1
        if self.on_done is not None:
            self.on_done(request.request_id, time_s)
