"""`runner=openai`: the workload against any OpenAI-compatible server (vLLM, SGLang, TGI, `transformers serve`),
streamed, with each chunk's arrival recorded.

The metrics follow `vllm bench serve`: TTFT is the first non-empty chunk's arrival after the send, ITL the gaps
between chunks, TPOT (E2E - TTFT) / (output tokens - 1), and the output token count is the server's own usage
figure, never a count of chunks. Outputs get the workload's lengths the way the server allows
(`runner.lengths`): `ignore_eos` (vLLM, SGLang), `generation_config` (`transformers serve`), or `none` (the
server may stop at EOS; the run says so through the usage counts). Any error of one request (HTTP status,
timeout, refused connection, a stream cut off) ends that request `failed` with the reason.

The client is as light as vllm bench's (aiohttp, one JSON parse a chunk, no response objects): on a machine whose
cores the server shares, a client that takes CPU time a chunk slows the server it measures, and starves vLLM's
front end, which then merges a request's tokens into one chunk. The openai SDK took 0.6-0.8 s of CPU a run of 1,024
streamed tokens here, a bare HTTP client 0.3 s (README, "How exact the client is").
"""

import json
import os

import aiohttp

from strategies import Request, RequestStatus


class ServerError(RuntimeError):
    """The server answered a request with an error: its HTTP status and message."""


class OpenAIClient:
    name = "openai"

    def __init__(self, url: str, model: str, endpoint: str = "completions", prompt: str = "text",
                 lengths: str = "ignore_eos", api_key_env: str | None = None, timeout_s: float = 600.0,
                 tokenizer=None):
        if prompt == "text" and tokenizer is None:
            raise ValueError("runner.prompt=text needs the model's tokenizer to turn prompt ids into text "
                             "(model=hf model.name=<its hub id or folder>), or runner.prompt=ids")
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = f"{url.rstrip('/')}/{'chat/completions' if endpoint == 'chat' else 'completions'}"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.model, self.endpoint, self.prompt, self.lengths = model, endpoint, prompt, lengths
        self.tokenizer = tokenizer
        self._session: aiohttp.ClientSession | None = None  # made inside the event loop that uses it

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No connection cap: a closed-loop client of 256 must have 256 requests in flight. No retries: a
            # retried request would hide the failure and skew its latency.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout,
                                                  headers=self.headers)
        return self._session

    async def warm_up(self) -> None:
        """One short request before the run, as vllm bench sends: a server that loads its model or builds its
        batching manager on first use does so outside the measurements. Its error is the run's (wrong model name,
        wrong port): raised, so the run stops with it before any request is measured."""
        prompt = [1, 2, 3, 4] if self.prompt == "ids" else self.tokenizer.decode([1, 2, 3, 4])
        async with self.session.post(self.url, json=self._body(prompt, 2, stream=False)) as response:
            await _check(response)
            await response.read()

    async def submit(self, request: Request, clock) -> None:
        prompt = request.token_ids if self.prompt == "ids" else self.tokenizer.decode(request.token_ids)
        usage = None
        async with self.session.post(self.url, json=self._body(prompt, request.max_new_tokens)) as response:
            await _check(response)
            async for line in response.content:  # server-sent events, one `data: {json}` line each
                now = clock()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, `event:` lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ServerError(f"the server ended the stream with an error: {chunk['error']}")
                if chunk.get("choices") and _text(chunk["choices"][0]):
                    if request.first_token_s is None:
                        request.first_token_s = now
                    request.token_times_s.append(now)
                usage = chunk.get("usage") or usage
        request.finish_s = clock()
        if usage is None:
            raise ServerError("the server's stream ended without a usage count (is it OpenAI-compatible?)")
        request.num_output_tokens = usage["completion_tokens"]
        # Prompt tokens the server's prefix cache held, where it says (vLLM with --enable-prompt-tokens-details).
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            request.num_cached_tokens = details["cached_tokens"]
        request.status = RequestStatus.FINISHED

    def _body(self, prompt, max_tokens: int, stream: bool = True) -> dict:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, **self._length_options(max_tokens)}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            return body | {"messages": [{"role": "user", "content": prompt}]}
        return body | {"prompt": prompt}

    def _length_options(self, output_len: int) -> dict:
        if self.lengths == "ignore_eos":
            return {"ignore_eos": True}
        if self.lengths == "generation_config":
            return {"generation_config": json.dumps({"max_new_tokens": output_len, "min_new_tokens": output_len,
                                                     "do_sample": False})}
        return {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _check(response: aiohttp.ClientResponse) -> None:
    """Raise `ServerError` with the status and the server's own message for an answer other than 200."""
    if response.status == 200:
        return
    text = (await response.text(errors="replace")).strip()
    try:
        message = json.loads(text).get("error", text)
        message = message.get("message", message) if isinstance(message, dict) else message
    except (ValueError, AttributeError):
        message = text
    raise ServerError(f"HTTP {response.status}: {str(message)[:300]}")


def _text(choice: dict) -> str:
    delta = choice.get("delta")  # chat
    return (delta.get("content") if delta is not None else choice.get("text")) or ""
