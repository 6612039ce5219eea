"""Routers: which replica of a simulated cluster gets an arriving request."""

from harness.core.engine import Engine, request_for
from harness.core.prefix_cache import prompt_block_hashes
from workloads import RequestSpec


class RoundRobin:
    def __init__(self):
        self.next = 0

    def __call__(self, engines: list[Engine], spec: RequestSpec) -> Engine:
        engine = engines[self.next % len(engines)]
        self.next += 1
        return engine


def least_outstanding(engines: list[Engine], spec: RequestSpec) -> Engine:
    """The replica with the fewest unfinished requests right now; the lowest index on ties."""
    return min(engines, key=lambda e: e.num_outstanding)


class PrefixAware:
    """The replica whose prefix cache holds most of the prompt, balanced against load, as vLLM's production
    stack scores its endpoints (load-aware KV-cache routing; llm-d and SGLang's router weigh the same two things):
    `matched tokens / prompt tokens - load_weight * (load - mean load) / max(1, mean load)`, load being unfinished
    requests. The highest score wins; then the least loaded, then the lowest index. `load_weight` 0 follows the
    cache alone (a hot prefix piles onto one replica); a large one is least-outstanding."""

    def __init__(self, load_weight: float = 0.5):
        self.load_weight = load_weight

    def __call__(self, engines: list[Engine], spec: RequestSpec) -> Engine:
        block_size = engines[0].allocator.block_size
        request = request_for(spec)
        hashes = prompt_block_hashes(request, block_size)
        loads = [e.num_outstanding for e in engines]
        mean = sum(loads) / len(loads)

        def score(i: int) -> tuple[float, int, int]:
            cached_tokens_of = getattr(engines[i].allocator, "cached_tokens_of", None)  # a simulated engine's: none
            matched = cached_tokens_of(hashes, request.num_tokens) if cached_tokens_of else 0
            relative_load = (loads[i] - mean) / max(1.0, mean)
            return matched / spec.prompt_len - self.load_weight * relative_load, -loads[i], -i

        return engines[max(range(len(engines)), key=score)]


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": lambda: least_outstanding, "prefix_aware": PrefixAware}


def make_router(name: str, load_weight: float = 0.5):
    """A router by name (`runner.router`); `load_weight` is the prefix-aware router's (`runner.router_load_weight`)."""
    return PrefixAware(load_weight) if name == "prefix_aware" else ROUTERS[name]()
