"""transformers' own continuous batching (`ContinuousBatchingManager`, what `generate_batch()` and
`transformers serve --continuous-batching` run), driven in process by the live replay.

Configured to our run's token budget, request cap, KV block size and block count where its config takes them, with
EOS off (every request generates its `max_new_tokens`, as ours do) and per-token timestamps recorded by the
manager itself. It runs its own scheduling thread, so the replay is in wall time (see `harness.peers.live`).
"""

import asyncio
import dataclasses
import time

from transformers import ContinuousBatchingConfig, GenerationConfig

from strategies import Request, RequestStatus

NO_EOS = -1  # the manager's "never stop early"


def manager_config(max_batch_tokens: int, max_num_seqs: int, block_size: int, num_blocks: int):
    """The manager's config from ours. Its block size is `page_size` in newer transformers, `block_size` before."""
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    size_key = "page_size" if "page_size" in names else "block_size"
    options = {size_key: block_size, "num_blocks": num_blocks, "max_batch_tokens": max_batch_tokens,
               "max_requests_per_batch": max_num_seqs, "allow_block_sharing": False}
    return ContinuousBatchingConfig(**{k: v for k, v in options.items() if k in names})


class TransformersContinuous:
    name = "hf_continuous"

    def __init__(self, model, max_batch_tokens: int, max_num_seqs: int, block_size: int, num_blocks: int):
        generation = GenerationConfig(do_sample=False, eos_token_id=NO_EOS)
        self.manager = model.init_continuous_batching(
            generation_config=generation,
            continuous_batching_config=manager_config(max_batch_tokens, max_num_seqs, block_size, num_blocks))

    def __enter__(self) -> "TransformersContinuous":
        self.manager.start()
        # One short request first, so one-time set-up costs stay out of timings (as our runner's warm-up).
        self.manager.add_request([1, 2, 3, 4], request_id="warm-up", max_new_tokens=2, eos_token_id=NO_EOS)
        if self.manager.get_result(request_id="warm-up", timeout=600) is None:
            raise RuntimeError("transformers' continuous batching manager did not answer a first request")
        return self

    def __exit__(self, *exc) -> None:
        self.manager.stop(block=True)

    async def submit(self, request: Request, clock) -> None:
        """Add `request` to the manager and wait until it is done; its tokens are stamped with the manager's own
        timestamps (perf_counter), moved onto the run's clock."""
        origin = time.perf_counter() - clock()
        result = asyncio.get_running_loop().create_future()

        def deliver(output) -> None:
            if output.is_finished() and not result.done():
                result.set_result(output)

        request_id = str(request.request_id)
        self.manager.register_result_handler(request_id, deliver)
        accepted = self.manager.add_request(request.token_ids, request_id=request_id,
                                            max_new_tokens=request.max_new_tokens, record_timestamps=True,
                                            eos_token_id=NO_EOS)
        if accepted is None:
            raise RuntimeError("transformers' continuous batching manager refused the request (it is stopping)")
        output = await result
        if output.error:
            raise RuntimeError(output.error)
        request.token_ids.extend(output.generated_tokens)
        request.num_output_tokens = len(output.generated_tokens)
        request.token_times_s = [t - origin for t in output.timestamps]
        request.first_token_s = request.token_times_s[0] if request.token_times_s else None
        if output.lifespan[0] > 0:
            request.first_scheduled_s = output.lifespan[0] - origin
        request.finish_s = request.token_times_s[-1] if request.token_times_s else clock()
        request.status = RequestStatus.FINISHED
