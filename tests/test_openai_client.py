"""The `runner=openai` client and the `/metrics` reader against a scripted OpenAI-compatible server (aiohttp, on a
loopback port in the test's own event loop): what each stream shape, error and metrics page becomes."""

import asyncio
import json

import pytest
from aiohttp import web

from harness.core.records import RunRecords
from harness.peers.job import _tokens_per_chunk, merged_stream_warning
from harness.peers.live import live_replay
from harness.peers.openai_server import OpenAIClient, ServerError
from harness.peers.server_metrics import SERVER_KEYS, ServerMetrics
from strategies import RequestStatus
from workloads import RequestSpec

METRICS_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preemptions}
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {tokens}
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}
vllm:iteration_tokens_total_bucket{{engine="0",le="1.0",model_name="m"}} 0.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {requests}
"""


def chunk(text: str | None = None, usage: int | None = None, cached: int | None = None) -> bytes:
    """A stream chunk: a token's text, or the usage count (with the prompt tokens the server's cache held)."""
    counts = {"completion_tokens": usage} if usage is not None else None
    if counts is not None and cached is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    body = {"choices": [{"index": 0, "text": text}] if text is not None else [], "usage": counts}
    return f"data: {json.dumps(body)}\n\n".encode()


async def serve(handler, metrics=None):
    """A server on a free loopback port answering /v1/completions with `handler` and /metrics with `metrics()`."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    if metrics is not None:
        async def page(request: web.Request) -> web.Response:
            return web.Response(text=metrics())
        app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1"


def streaming(pieces: list[bytes], pause_s: float = 0.0):
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        handler.bodies.append(body)
        response = web.StreamResponse()
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(pause_s)
        return response
    handler.bodies = []
    return handler


def replay(handler, num_requests: int = 2, metrics=None) -> tuple[RunRecords, dict]:
    async def go():
        runner, url = await serve(handler, metrics)
        client = OpenAIClient(url, "m", prompt="ids")
        records = RunRecords()
        try:
            async with ServerMetrics(url, interval_s=0.01) as own:
                await live_replay([RequestSpec(i, 0.0, (1, 2, 3), 4) for i in range(num_requests)],
                                  client.submit, records, max_concurrency=1)
        finally:
            await client.close()
            await runner.cleanup()
        return records, own.figures()
    return asyncio.run(go())


def test_each_token_chunk_is_stamped_and_the_count_is_the_servers_usage():
    handler = streaming([chunk("a"), chunk("b"), chunk(""), chunk("c"), chunk("d"), chunk(usage=4),
                         b"data: [DONE]\n\n"], pause_s=0.005)
    records, _ = replay(handler)
    for request in records.requests:
        assert request.status is RequestStatus.FINISHED and request.num_output_tokens == 4
        assert len(request.token_times_s) == 4  # the empty chunk carries no token
        assert request.first_token_s == request.token_times_s[0] <= request.finish_s
        assert request.token_times_s == sorted(request.token_times_s)
    sent = handler.bodies[0]
    assert sent["prompt"] == [1, 2, 3] and sent["max_tokens"] == 4 and sent["ignore_eos"] and sent["stream"]
    assert _tokens_per_chunk(records) == pytest.approx(1.0)


def test_a_servers_count_of_cached_prompt_tokens_is_kept_where_it_gives_one():
    records, _ = replay(streaming([chunk("a"), chunk(usage=1, cached=2), b"data: [DONE]\n\n"]))
    assert [r.num_cached_tokens for r in records.requests] == [2, 2]
    records, _ = replay(streaming([chunk("a"), chunk(usage=1), b"data: [DONE]\n\n"]))
    assert [r.num_cached_tokens for r in records.requests] == [None, None]  # unknown, not zero


def test_a_merged_stream_is_measured_and_warned_about():
    records, _ = replay(streaming([chunk("a b c d"), chunk(usage=4), b"data: [DONE]\n\n"]))
    assert _tokens_per_chunk(records) == pytest.approx(4.0)
    warning = merged_stream_warning(None, _tokens_per_chunk(records))
    assert "4.0 tokens a chunk" in warning and "merged" in warning
    assert merged_stream_warning("busy", 1.0) == "busy"


@pytest.mark.parametrize("pieces, reason", [
    ([chunk("a")], "without a usage count"),
    ([chunk("a"), b'data: {"error": {"message": "engine died"}}\n\n'], "engine died"),
])
def test_a_broken_stream_fails_its_request_with_the_reason(pieces, reason):
    records, _ = replay(streaming(pieces), num_requests=1)
    (request,) = records.requests
    assert request.status is RequestStatus.FAILED and reason in request.reject_reason


def test_an_http_error_fails_the_request_with_the_servers_message():
    async def refuse(request):
        return web.json_response({"error": {"message": "model 'm' does not exist"}}, status=404)
    records, _ = replay(refuse, num_requests=1)
    assert "HTTP 404: model 'm' does not exist" in records.requests[0].reject_reason


def test_the_warm_up_raises_the_servers_refusal():
    async def go():
        async def refuse(request):
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        runner, url = await serve(refuse)
        client = OpenAIClient(url, "m", prompt="ids")
        try:
            with pytest.raises(ServerError, match="HTTP 404: no such model"):
                await client.warm_up()
        finally:
            await client.close()
            await runner.cleanup()
    asyncio.run(go())


def test_the_servers_metrics_are_read_as_growth_over_the_run():
    page = {"running": 0, "preemptions": 3, "queries": 100, "hits": 40, "tokens": 500, "steps": 10,
            "ttft_sum": 1.0, "requests": 5}

    def metrics() -> str:
        current = dict(page)
        page.update(running=2, preemptions=4, queries=228, hits=104, tokens=548, steps=22, ttft_sum=1.2,
                    requests=7)  # what the run adds, seen from the second scrape on
        return METRICS_PAGE.format(**current)

    _, figures = replay(streaming([chunk("a"), chunk(usage=1), b"data: [DONE]\n\n"], pause_s=0.05),
                        metrics=metrics)
    assert set(figures) == set(SERVER_KEYS)
    assert figures["server_iterations"] == 12 and figures["server_tokens_per_iteration"] == pytest.approx(4.0)
    assert figures["server_preemptions"] == 1
    assert figures["server_prefix_cache_queries"] == 128 and figures["server_prefix_cache_hit_rate"] == 0.5
    assert figures["server_ttft_s_mean"] == pytest.approx(0.1)
    assert figures["server_running_max"] == 2
    assert figures["server_itl_s_mean"] is None  # a figure the page does not have stays unknown


def test_a_server_without_metrics_leaves_every_figure_unknown():
    _, figures = replay(streaming([chunk("a"), chunk(usage=1), b"data: [DONE]\n\n"]))
    assert figures == dict.fromkeys(SERVER_KEYS)
