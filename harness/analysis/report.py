"""A run's `report.md` and the short table printed at the end of every run."""

import pandas as pd

from strategies import RequestStatus

NOT_REPORTED = "not reported (a peer's own engine)"


def engine_side(fmt):
    """A row only our engines can fill: a peer leaves it None, and the table says so instead of a number."""
    return lambda s: NOT_REPORTED if s.get("num_steps") is None else fmt(s)


TERMINAL_ROWS = [
    ("requests finished / rejected / failed",
     lambda s: f"{s['num_finished']} / {s['num_rejected']} / {s.get('num_failed', 0)}"),
    ("makespan", lambda s: duration(s["makespan_s"])),
    ("output throughput", lambda s: f"{s['output_throughput_tps']:.1f} tok/s"),
    ("request throughput", lambda s: f"{s['request_throughput_rps']:.2f} req/s"),
    ("TTFT p50 / p99", lambda s: f"{duration(s['ttft_s_p50'])} / {duration(s['ttft_s_p99'])}"),
    ("TPOT p50 / p99", lambda s: f"{duration(s['tpot_s_p50'])} / {duration(s['tpot_s_p99'])}"),
    ("E2E p50 / p99", lambda s: f"{duration(s['e2e_s_p50'])} / {duration(s['e2e_s_p99'])}"),
    ("padding waste",
     engine_side(lambda s: f"{s['padding_waste']:.1%} of {s['num_computed_tokens']} computed tokens")),
    ("KV use peak / mean",
     engine_side(lambda s: f"{s['kv_peak_utilization']:.1%} / {s['kv_mean_utilization']:.1%}")),
    ("preemptions", engine_side(lambda s: str(s["num_preemptions"]))),
    ("prefix cache", lambda s: prefix_line(s)),
    ("goodput (SLOs met)", lambda s: f"{s['goodput_rps']:.2f} req/s"),
    ("harness overhead", engine_side(lambda s: f"{duration(s['overhead_s'])} of {duration(s['replica_s'])}"
                                                + (f" ({s['replicas']} replicas' time)" if s.get("replicas", 1) > 1
                                                   else ""))),
]


ENVIRONMENT_KEYS = ("device", "device_name", "dtype", "threads", "torch", "transformers", "triton", "python",
                    "git_commit")


def duration(seconds: float | None) -> str:
    """Seconds in the unit a person reads: 850 µs, 12.3 ms, 4.56 s, 556 s, 2.5 h."""
    if seconds is None or seconds != seconds:
        return "n/a"
    size = abs(seconds)
    if size < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if size < 1:
        return f"{seconds * 1e3:.1f} ms"
    if size < 100:
        return f"{seconds:.2f} s"
    if size < 3600:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h"


def prefix_line(s: dict) -> str:
    """The prefix cache in one line: off, or how much of the prompts it held (where that is known)."""
    if s.get("prefix_caching") is False:
        return "off"
    rate = s.get("prefix_hit_rate_tokens")
    if rate is None:
        server = s.get("server_prefix_cache_hit_rate")
        return "n/a" if server is None else f"{server:.1%} of prompt tokens hit (the server's count)"
    evictions = s.get("num_prefix_evictions")
    return (f"{rate:.1%} of prompt tokens hit ({s['prefix_hit_rate_requests']:.0%} of requests)"
            + ("" if evictions is None else f", {evictions} blocks evicted"))


def terminal_table(summary: dict) -> str:
    title = f"{summary['strategy']} · {summary['workload']} · {summary['model']} · {summary['runner']}"
    width = max(len(name) for name, _ in TERMINAL_ROWS)
    lines = [title, "-" * len(title)] + [f"{name:<{width}}  {fmt(summary)}" for name, fmt in TERMINAL_ROWS]
    return "\n".join(lines)


def run_report(summary: dict, requests: pd.DataFrame, steps: pd.DataFrame | None, workload_info: dict,
               plots: list, tables: list[str]) -> str:
    """`steps` None: a peer, which reports no steps. `tables`: the table files written beside the report."""
    ended = requests[requests.status.isin([RequestStatus.REJECTED.label, RequestStatus.FAILED.label])]
    warning, misread = summary.get("measurement_warning"), summary.get("layout_warning")
    parts = [
        f"# {summary['strategy']} on {summary['workload']}",
        "",
        *([f"> **Warning**: {misread}.", ""] if misread else []),
        *([f"> **Warning**: {warning} (see Measurement below).", ""] if warning else []),
        "```",
        terminal_table(summary),
        "```",
        "",
        "## Workload",
        "",
        *[f"- {key}: {value}" for key, value in workload_info.items()],
        "",
        *_composition(steps, summary, tables),
        "## Plots",
        "",
        *[f"![{p.stem}]({p.as_posix()})" for p in plots],
        "",
        *_prefix_cache(summary),
        *_measurement(summary),
        *_server(summary),
        "## Environment",
        "",
        *[f"- {key}: {summary.get(key)}" for key in ENVIRONMENT_KEYS],
    ]
    if len(ended):
        parts += ["", "## Rejected and failed requests", "", *[
            f"- request {row.request_id} ({row.status}): {row.reject_reason}" for row in ended.itertuples()
        ]]
    return "\n".join(parts) + "\n"


def _composition(steps: pd.DataFrame | None, summary: dict, tables: list[str]) -> list[str]:
    if steps is None:
        return ["## What the model computed", "",
                f"{summary['runner']} runs its own engine, which reports no steps: padding, KV use and busy time "
                "are not known (left empty in `summary.json`, never estimated).", ""]
    composition = pd.DataFrame({
        "tokens": [steps.num_prefill_tokens.sum(), steps.num_decode_tokens.sum(), steps.num_padding_tokens.sum()],
    }, index=["prefill", "decode", "padding"])
    composition["share"] = (composition.tokens / composition.tokens.sum()).map("{:.1%}".format)
    return ["## What the model computed", "",
            "Every token slot the model ran, by kind. Padding is compute spent on no request's sequence.", "",
            composition.to_markdown(), "",
            f"{summary['num_steps']} steps. Tables: {', '.join(f'`{t}`' for t in tables)}.", ""]



def _prefix_cache(summary: dict) -> list[str]:
    """What the prefix cache saved: nothing when it was off or no request's cached tokens are known."""
    rate = summary.get("prefix_hit_rate_tokens")
    if summary.get("prefix_caching") is False or rate is None:
        return []
    lines = ["## Prefix cache", "",
             "Prompt blocks already computed (a shared system prompt, a conversation's earlier turns, a trace's "
             "shared blocks) are reused from the cache instead of computed again.", "",
             f"- prompt tokens found cached at admission: {rate:.1%}; requests with a hit: "
             f"{summary['prefix_hit_rate_requests']:.1%}",
             f"- TTFT mean with a hit {duration(summary['ttft_s_hit_mean'])} (p50 "
             f"{duration(summary['ttft_s_hit_p50'])}), without {duration(summary['ttft_s_miss_mean'])} (p50 "
             f"{duration(summary['ttft_s_miss_p50'])})"]
    if summary.get("prefix_cache_queried_tokens") is not None:
        lines += [f"- lookups at every admission, re-admissions after preemption included (vLLM's counters): "
                  f"{summary['prefix_cache_hit_tokens']} of {summary['prefix_cache_queried_tokens']} tokens hit",
                  f"- blocks evicted to make room: {summary.get('num_prefix_evictions', 0)}; most named blocks "
                  f"cached at once: {summary['kv_cached_blocks_max']}"]
    return lines + [""]


def _measurement(summary: dict) -> list[str]:
    """How quiet the machine was while the run measured wall time; nothing for a simulation."""
    if summary.get("machine_cores") is None:
        return []
    spread = summary.get("step_time_spread")
    return ["## Measurement", "",
            f"- other work on the machine: {summary['other_cpu_cores']:.2f} of {summary['machine_cores']} cores "
            f"(the hypervisor's steal {summary['steal_cores']:.2f}); the run kept {summary['run_cores']} busy",
            f"- load average (1 min, the run included): {summary['load_avg_1m']:.2f}",
            "- same-shaped steps' spread (p90 / median - 1): "
            + ("n/a (no step shape repeated enough)" if spread is None else f"{spread:.2f}"),
            f"- verdict: {summary['measurement_warning'] or 'a quiet machine: the timings stand'}", ""]


def _server(summary: dict) -> list[str]:
    """What the server said about its own engine (`/metrics`) beside what the client measured; nothing for a run
    whose server said nothing."""
    if summary.get("server_iterations") is None:
        return []
    rows = [("TTFT mean", duration(summary["ttft_s_mean"]), duration(summary["server_ttft_s_mean"])),
            ("ITL mean", duration(summary["itl_s_mean"]), duration(summary["server_itl_s_mean"])),
            ("E2E mean", duration(summary["e2e_s_mean"]), duration(summary["server_e2e_s_mean"]))]
    per_chunk = summary.get("stream_tokens_per_chunk")
    return ["## The server's own figures", "",
            "What the server reported at `/metrics` over the run beside what the client measured: a gap is time "
            "spent between the engine and the client (the server's front end, the network, the client).", "",
            "| | client | server |", "|---|---|---|",
            *[f"| {name} | {ours} | {theirs} |" for name, ours, theirs in rows],
            "",
            f"- engine steps: {summary['server_iterations']}, {summary['server_tokens_per_iteration']:.1f} tokens "
            f"a step; running requests mean {_number(summary['server_running_mean'])} (max "
            f"{_number(summary['server_running_max'])}), waiting mean {_number(summary['server_waiting_mean'])}",
            f"- queueing in the server: mean {duration(summary['server_queue_s_mean'])}; preemptions: "
            f"{summary['server_preemptions']}",
            "- prefix cache: " + ("no queries" if summary["server_prefix_cache_hit_rate"] is None else
                                  f"{summary['server_prefix_cache_hit_rate']:.1%} of "
                                  f"{summary['server_prefix_cache_queries']} prompt tokens hit"),
            "- tokens a stream chunk: " + ("n/a" if per_chunk is None else f"{per_chunk:.2f}"), ""]


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
