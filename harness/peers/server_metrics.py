"""What a vLLM server says about its own engine over a run (`GET /metrics`, Prometheus text), so that a delay in
the client and one in the server can be told apart: the server's counters (steps and the tokens they carried,
preemptions, prefix-cache queries and hits, its own TTFT, ITL, queueing and end-to-end times) read before and after
the workload, and its running and waiting counts sampled while it runs.

A server without `/metrics`, or one that names its figures otherwise (SGLang's are `sglang:...`), leaves every
figure None: the run goes on, the summary says nothing it did not measure.
"""

import asyncio
from collections import defaultdict

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Summary key → the counter (a Prometheus sample name) whose growth over the run it is.
COUNTERS = {
    "server_iterations": "vllm:iteration_tokens_total_count",
    "server_iteration_tokens": "vllm:iteration_tokens_total_sum",
    "server_preemptions": "vllm:num_preemptions_total",
    "server_prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "server_prefix_cache_hits": "vllm:prefix_cache_hits_total",
}
# Summary key → the histogram whose mean over the run's requests it is (seconds).
MEANS = {
    "server_ttft_s_mean": "vllm:time_to_first_token_seconds",
    "server_itl_s_mean": "vllm:inter_token_latency_seconds",
    "server_queue_s_mean": "vllm:request_queue_time_seconds",
    "server_e2e_s_mean": "vllm:e2e_request_latency_seconds",
}
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
WANTED = (*COUNTERS.values(), *(f"{name}_{part}" for name in MEANS.values() for part in ("sum", "count")),
          *GAUGES.values())
SERVER_KEYS = (*COUNTERS, "server_tokens_per_iteration", "server_prefix_cache_hit_rate", *MEANS,
               *(f"server_{gauge}_{stat}" for gauge in GAUGES for stat in ("mean", "max")))


class ServerMetrics:
    """`async with ServerMetrics(url): <the workload>`, then `figures()`: the summary's `server_*` keys."""

    # Every scrape has the server render its whole page (some 1,500 lines for vLLM): sampling every 0.5 s, runs
    # here were about 3% slower than unsampled ones (within this machine's run-to-run noise); every second halves it.
    def __init__(self, url: str, interval_s: float = 1.0):
        self.metrics_url = url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.interval_s = interval_s
        self._first = self._last = None
        self._samples: dict[str, list[float]] = defaultdict(list)
        self._session = self._sampler = None

    async def __aenter__(self) -> "ServerMetrics":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self._first = await self._scrape()
        if self._first is not None:
            self._sampler = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
            self._last = await self._scrape()
        await self._session.close()

    async def _scrape(self) -> dict[str, float] | None:
        """The wanted samples, each summed over its label sets (engines, models); None if the server has none."""
        try:
            async with self._session.get(self.metrics_url) as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        # Only the wanted lines are parsed: a vLLM server exposes some 1,500, and the parse shares the client's core.
        lines = "\n".join(line for line in text.splitlines() if line.startswith(WANTED))
        values: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                values[sample.name] += sample.value
        return dict(values) if values else None

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            now = await self._scrape()
            for gauge, name in GAUGES.items():
                if now is not None and name in now:
                    self._samples[gauge].append(now[name])

    def figures(self) -> dict:
        figures = dict.fromkeys(SERVER_KEYS)
        first, last = self._first, self._last
        if first is None or last is None:
            return figures

        def growth(name: str) -> float | None:
            return last[name] - first.get(name, 0.0) if name in last else None

        figures |= {key: None if growth(name) is None else round(growth(name)) for key, name in COUNTERS.items()}
        for key, name in MEANS.items():
            count = growth(f"{name}_count")
            figures[key] = growth(f"{name}_sum") / count if count else None
        if figures["server_iterations"]:
            figures["server_tokens_per_iteration"] = figures["server_iteration_tokens"] / figures["server_iterations"]
        if figures["server_prefix_cache_queries"]:
            figures["server_prefix_cache_hit_rate"] = (figures["server_prefix_cache_hits"]
                                                       / figures["server_prefix_cache_queries"])
        for gauge, values in self._samples.items():
            figures[f"server_{gauge}_mean"] = sum(values) / len(values)
            figures[f"server_{gauge}_max"] = max(values)
        return figures
