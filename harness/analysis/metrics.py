"""Records → tables and the run summary. Definitions follow vLLM's benchmark where it has one."""

import math

import numpy as np
import pandas as pd

from harness.core.records import RunRecords
from strategies import RequestStatus

PERCENTILES = (50, 90, 99)


def requests_table(records: RunRecords) -> pd.DataFrame:
    """One row per request that entered, finished or rejected. Built column by column: a million rows in seconds."""
    requests = records.requests

    def column(read) -> np.ndarray:
        return np.array([read(r) for r in requests], dtype=float)  # None reads as NaN

    sent, first = column(lambda r: r.sent_s), column(lambda r: r.first_token_s)
    finish, scheduled = column(lambda r: r.finish_s), column(lambda r: r.first_scheduled_s)
    outputs = np.array([r.num_output_tokens for r in requests], dtype=np.int64)
    arrival = column(lambda r: r.arrival_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        # TPOT excludes the first token; undefined for a single output token.
        tpot = np.where(outputs > 1, (finish - first) / (outputs - 1), math.nan)
    return pd.DataFrame({
        "request_id": np.array([r.request_id for r in requests], dtype=np.int64),
        "status": [r.status.label for r in requests],
        "reject_reason": [r.reject_reason or "" for r in requests],
        "arrival_s": arrival,
        "sent_s": sent,
        "prompt_len": np.array([r.num_prompt_tokens for r in requests], dtype=np.int64),
        "max_new_tokens": np.array([r.max_new_tokens for r in requests], dtype=np.int64),
        "num_output_tokens": outputs,
        "num_preemptions": np.array([r.num_preemptions for r in requests], dtype=np.int64),
        # Prompt tokens found in the prefix cache at its first admission (a server's count where it reports one);
        # empty where unknown: never admitted, or a peer that does not say.
        "num_cached_tokens": column(lambda r: r.num_cached_tokens),
        "first_scheduled_s": scheduled,
        "first_token_s": first,
        "finish_s": finish,
        # Latencies count from the send, as vllm bench does; a closed-loop client's hold is client_wait_s.
        "client_wait_s": sent - arrival,
        "queue_s": scheduled - sent,
        "ttft_s": first - sent,
        "tpot_s": tpot,
        "e2e_s": finish - sent,
    })


def steps_table(records: RunRecords, num_blocks: int) -> pd.DataFrame:
    steps = records.steps.frame()
    if not steps.empty:
        steps["num_computed_tokens"] = steps.num_prefill_tokens + steps.num_decode_tokens + steps.num_padding_tokens
        steps["padding_waste"] = steps.num_padding_tokens / steps.num_computed_tokens
        steps["kv_utilization"] = steps.kv_used_blocks / num_blocks
    return steps


def inter_token_latencies(runs: list[RunRecords]) -> tuple[np.ndarray, np.ndarray]:
    """Every gap between consecutive tokens of a request, pooled over requests and replicas, as (values, how
    many times each occurs): per token where requests keep their token times, per step where the simulator
    counted the requests that got a token one step after their previous one, or after the same pause."""
    one_by_one, per_step, counts = [np.array([])], [np.array([])], [np.array([], dtype=np.int64)]
    for records in runs:
        one_by_one += [np.diff(r.token_times_s) for r in records.requests if len(r.token_times_s) > 1]
        one_by_one.append(np.frombuffer(records.other_gaps, dtype=float))
        per_step.append(np.frombuffer(records.shared_gaps, dtype=float))
        counts.append(np.frombuffer(records.shared_gap_counts, dtype=np.int64))
        gaps = np.frombuffer(records.gaps_per_step, dtype=np.int64)[1:]  # [steps - 1]: none before step 0
        if gaps.any():
            ends = records.steps.column("start_s") + records.steps.column("duration_s")  # as the clock moved
            per_step.append((ends[1:] - ends[:-1])[gaps > 0])
            counts.append(gaps[gaps > 0])
    singles = np.concatenate(one_by_one)
    return (np.concatenate([singles, *per_step]),
            np.concatenate([np.ones(singles.size, dtype=np.int64), *counts]))


def distribution(name: str, values, weights=None) -> dict[str, float]:
    """Mean and percentiles of `values`, each counted `weights` times (default once); NaN values are left out.
    Percentiles interpolate linearly between ranks, as numpy's default does on the repeated values."""
    values = np.asarray(values, dtype=float)
    weights = np.ones(values.size, dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    keep = ~np.isnan(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return {f"{name}_mean": math.nan} | {f"{name}_p{p}": math.nan for p in PERCENTILES}
    order = np.argsort(values, kind="stable")
    values, ranks = values[order], np.cumsum(weights[order])  # ranks[i]: values up to and including i
    total = int(ranks[-1])
    mean = float(np.dot(values, weights[order]) / total)
    return {f"{name}_mean": mean} | {f"{name}_p{p}": _percentile(values, ranks, total, p) for p in PERCENTILES}


def _percentile(values: np.ndarray, ranks: np.ndarray, total: int, p: float) -> float:
    position = (p / 100) * (total - 1)
    below = math.floor(position)
    low, high = (float(values[np.searchsorted(ranks, i, side="right")]) for i in (below, min(below + 1, total - 1)))
    t = position - below
    # numpy's lerp: from the nearer end, so equal neighbours give exactly their value
    return low + (high - low) * t if t < 0.5 else high - (high - low) * (1 - t)


def meets_slo(finished: pd.DataFrame, ttft_s: float | None, tpot_s: float | None) -> pd.Series:
    """Which finished requests meet the SLOs given (None = no constraint); a one-token request has no TPOT."""
    ok = pd.Series(True, index=finished.index)
    if ttft_s is not None:
        ok &= finished.ttft_s <= ttft_s
    if tpot_s is not None:
        ok &= finished.tpot_s.isna() | (finished.tpot_s <= tpot_s)
    return ok


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | None, itl: tuple[np.ndarray, np.ndarray], labels: dict,
              slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, num_replicas: int = 1) -> dict:
    """The flat `summary.json` record (README, "Reading a run"): SI units; counts, throughput, latency
    distributions, goodput, padding, KV use, step shape and where the time went. `steps` None: a peer that
    reports no steps (another engine, a server), whose step, padding, KV and busy figures are None, not zero.
    `steps` of `num_replicas` replicas: where the time went is in replica-seconds (see `_engine_side`)."""
    summary = _client_side(requests, itl, labels, slo_ttft_s, slo_tpot_s) | prefix_hits(requests)
    if steps is None:
        return summary | dict.fromkeys(ENGINE_SIDE)
    return summary | _engine_side(steps, int(requests.num_preemptions.sum()), summary["makespan_s"], num_replicas)


def prefix_hits(requests: pd.DataFrame) -> dict:
    """How much of the prompts the prefix cache held, over the requests whose cached tokens are known: as a share
    of prompt tokens and of requests (any hit), and TTFT split by hit and miss (finished requests). None where
    nothing is known (as summary.json writes it)."""
    known = requests[requests.num_cached_tokens.notna()]
    prompt_tokens = int(known.prompt_len.sum())
    hit = known.num_cached_tokens > 0
    finished = known[known.status == RequestStatus.FINISHED.label]
    finished_hit = finished.num_cached_tokens > 0
    return {
        "prefix_hit_rate_tokens": float(known.num_cached_tokens.sum() / prompt_tokens) if prompt_tokens else None,
        "prefix_hit_rate_requests": float(hit.mean()) if len(known) else None,
        **_mean_and_p50("ttft_s_hit", finished.ttft_s[finished_hit]),
        **_mean_and_p50("ttft_s_miss", finished.ttft_s[~finished_hit]),
    }


def _mean_and_p50(name: str, values: pd.Series) -> dict:
    values = values.dropna()
    if values.empty:
        return {f"{name}_mean": None, f"{name}_p50": None}
    return {f"{name}_mean": float(values.mean()), f"{name}_p50": float(values.median())}


def _client_side(requests: pd.DataFrame, itl: tuple[np.ndarray, np.ndarray], labels: dict, slo_ttft_s: float | None,
                 slo_tpot_s: float | None) -> dict:
    """What a benchmark client sees of any system: counts, throughput, latencies, goodput."""
    finished = requests[requests.status == RequestStatus.FINISHED.label]
    start = requests.arrival_s.min()
    makespan = float(finished.finish_s.max() - start) if len(finished) else 0.0
    output_tokens = int(finished.num_output_tokens.sum())
    total_tokens = output_tokens + int(finished.prompt_len.sum())

    def per_second(x: float) -> float:
        return x / makespan if makespan > 0 else math.nan

    rejected = int((requests.status == RequestStatus.REJECTED.label).sum())
    failed = int((requests.status == RequestStatus.FAILED.label).sum())
    return dict(labels) | {
        "num_requests": len(requests),
        "num_finished": len(finished),
        "num_rejected": rejected,
        "num_failed": failed,
        # Nonzero only when a run was interrupted: requests that had entered and were still waiting or running.
        "num_unfinished": len(requests) - len(finished) - rejected - failed,
        "makespan_s": makespan,
        "request_throughput_rps": per_second(len(finished)),
        "output_throughput_tps": per_second(output_tokens),
        "total_throughput_tps": per_second(total_tokens),
        **distribution("ttft_s", finished.ttft_s),
        **distribution("tpot_s", finished.tpot_s),
        **distribution("itl_s", *itl),
        **distribution("e2e_s", finished.e2e_s),
        **distribution("queue_s", finished.queue_s),
        **distribution("client_wait_s", finished.client_wait_s),
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "goodput_rps": per_second(int(meets_slo(finished, slo_ttft_s, slo_tpot_s).sum())),
    }


def _engine_side(steps: pd.DataFrame, num_preemptions: int, makespan: float, num_replicas: int) -> dict:
    """Step, padding and KV figures, and where the time went: `busy_s` (in the model or cost model), `overhead_s`
    (the harness's own time in steps) and `idle_s` (nothing to do) are replica-seconds, summed over the replicas,
    so they add up to `replica_s` = makespan x replicas (one replica: the makespan itself)."""
    computed = int(steps.num_computed_tokens.sum()) if len(steps) else 0
    padding = int(steps.num_padding_tokens.sum()) if len(steps) else 0
    busy = float(steps.busy_s.sum()) if len(steps) else 0.0
    stepped = float(steps.duration_s.sum()) if len(steps) else 0.0
    kv_mean = float(np.average(steps.kv_utilization, weights=steps.duration_s)) if len(steps) else 0.0
    sequences = steps.num_seqs if len(steps) else pd.Series(dtype=float)
    scheduled = steps.num_prefill_tokens + steps.num_decode_tokens if len(steps) else pd.Series(dtype=float)
    return {
        "num_preemptions": num_preemptions,
        "num_steps": len(steps),
        "batch_size_mean": float(sequences.mean()) if len(steps) else 0.0,
        "batch_size_max": int(sequences.max()) if len(steps) else 0,
        "tokens_per_step_mean": float(scheduled.mean()) if len(steps) else 0.0,
        "tokens_per_step_max": int(scheduled.max()) if len(steps) else 0,
        "num_computed_tokens": computed,
        "num_padding_tokens": padding,
        "padding_waste": padding / computed if computed else 0.0,
        "kv_peak_utilization": float(steps.kv_utilization.max()) if len(steps) else 0.0,
        "kv_mean_utilization": kv_mean,
        # vLLM's prefix-cache counters: tokens looked up at every admission (re-admissions too), and found cached.
        "prefix_cache_queried_tokens": int(steps.num_lookup_tokens.sum()) if len(steps) else 0,
        "prefix_cache_hit_tokens": int(steps.num_cached_tokens.sum()) if len(steps) else 0,
        "kv_cached_blocks_max": int(steps.kv_cached_blocks.max()) if len(steps) else 0,
        "busy_s": busy,
        # The clock only moves by steps and by jumps over idle gaps: what is neither is the harness's own time.
        "overhead_s": stepped - busy,
        "idle_s": makespan * num_replicas - stepped,
        "replica_s": makespan * num_replicas,
    }


# What only our own engines can say (from their step records): a peer's summary has these keys, as None.
ENGINE_SIDE = tuple(_engine_side(pd.DataFrame(), 0, 0.0, 1))
