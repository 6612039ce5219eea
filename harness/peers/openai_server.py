"""`runner=openai`: the workload against any OpenAI-compatible server (vLLM, SGLang, TGI, `transformers serve`),
streamed, with each chunk's arrival recorded.

The metrics follow `vllm bench serve`: TTFT is the first non-empty chunk's arrival after the send, ITL the gaps
between chunks, TPOT (E2E - TTFT) / (output tokens - 1), and the output token count is the server's own usage
figure, never a count of chunks. Outputs get the workload's lengths the way the server allows
(`runner.lengths`): `ignore_eos` (vLLM, SGLang), `generation_config` (`transformers serve`), or `none` (the
server may stop at EOS; the run says so through the usage counts). Any error of one request (HTTP status,
timeout, refused connection, a stream cut off) ends that request `failed` with the reason.
"""

import json
import os

from openai import AsyncOpenAI

from strategies import Request, RequestStatus


class OpenAIClient:
    name = "openai"

    def __init__(self, url: str, model: str, endpoint: str = "completions", prompt: str = "text",
                 lengths: str = "ignore_eos", api_key_env: str | None = None, timeout_s: float = 600.0,
                 tokenizer=None):
        if prompt == "text" and tokenizer is None:
            raise ValueError("runner.prompt=text needs the model's tokenizer to turn prompt ids into text "
                             "(model=hf model.name=<its hub id or folder>), or runner.prompt=ids")
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        # No retries: a retried request would hide the failure and skew its latency.
        self.client = AsyncOpenAI(base_url=url, api_key=key or "none", timeout=timeout_s, max_retries=0)
        self.model, self.endpoint, self.prompt, self.lengths = model, endpoint, prompt, lengths
        self.tokenizer = tokenizer

    async def warm_up(self) -> None:
        """One short request before the run, as vllm bench sends: a server that loads its model or builds its
        batching manager on first use does so outside the measurements. Its error is the run's (wrong model name,
        wrong port): raised, so the run stops with it before any request is measured."""
        prompt = [1, 2, 3, 4] if self.prompt == "ids" else self.tokenizer.decode([1, 2, 3, 4])
        options = {"model": self.model, "max_tokens": 2, "temperature": 0.0}
        if self.endpoint == "chat":
            await self.client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **options)
        else:
            await self.client.completions.create(prompt=prompt, **options)

    async def submit(self, request: Request, clock) -> None:
        output_len = request.max_new_tokens
        prompt = request.token_ids if self.prompt == "ids" else self.tokenizer.decode(request.token_ids)
        options = {"model": self.model, "stream": True, "max_tokens": output_len, "temperature": 0.0,
                   "stream_options": {"include_usage": True}, "extra_body": self._length_options(output_len)}
        if self.endpoint == "chat":
            stream = await self.client.chat.completions.create(
                messages=[{"role": "user", "content": prompt}], **options)
        else:
            stream = await self.client.completions.create(prompt=prompt, **options)
        usage = None
        async for chunk in stream:
            now = clock()
            if chunk.choices and _text(chunk.choices[0]):
                if request.first_token_s is None:
                    request.first_token_s = now
                request.token_times_s.append(now)
            usage = chunk.usage or usage
        request.finish_s = clock()
        if usage is None:
            raise RuntimeError("the server's stream ended without a usage count (is it OpenAI-compatible?)")
        request.num_output_tokens = usage.completion_tokens
        request.status = RequestStatus.FINISHED

    def _length_options(self, output_len: int) -> dict:
        if self.lengths == "ignore_eos":
            return {"ignore_eos": True}
        if self.lengths == "generation_config":
            return {"generation_config": json.dumps({"max_new_tokens": output_len, "min_new_tokens": output_len,
                                                     "do_sample": False})}
        return {}

    async def close(self) -> None:
        await self.client.close()


def _text(choice) -> str:
    delta = getattr(choice, "delta", None)  # chat
    return (delta.content if delta is not None else choice.text) or ""
