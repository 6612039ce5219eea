"""A run's `report.md` and the short table printed at the end of every run."""

import pandas as pd

TERMINAL_ROWS = [
    ("requests finished / rejected", lambda s: f"{s['num_finished']} / {s['num_rejected']}"),
    ("makespan", lambda s: f"{s['makespan_s']:.2f} s"),
    ("output throughput", lambda s: f"{s['output_throughput_tps']:.1f} tok/s"),
    ("request throughput", lambda s: f"{s['request_throughput_rps']:.2f} req/s"),
    ("TTFT p50 / p99", lambda s: f"{_ms(s['ttft_s_p50'])} / {_ms(s['ttft_s_p99'])}"),
    ("TPOT p50 / p99", lambda s: f"{_ms(s['tpot_s_p50'])} / {_ms(s['tpot_s_p99'])}"),
    ("E2E p50 / p99", lambda s: f"{_ms(s['e2e_s_p50'])} / {_ms(s['e2e_s_p99'])}"),
    ("padding waste", lambda s: f"{s['padding_waste']:.1%} of {s['num_computed_tokens']} computed tokens"),
    ("KV use peak / mean", lambda s: f"{s['kv_peak_utilization']:.1%} / {s['kv_mean_utilization']:.1%}"),
    ("preemptions", lambda s: str(s["num_preemptions"])),
    ("goodput (SLOs met)", lambda s: f"{s['goodput_rps']:.2f} req/s"),
    ("harness overhead", lambda s: f"{s['overhead_s']:.2f} s of {s['makespan_s']:.2f} s"),
]


ENVIRONMENT_KEYS = ("device", "device_name", "dtype", "threads", "torch", "transformers", "triton", "python",
                    "git_commit")


def _ms(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds * 1e3:.1f} ms"


def terminal_table(summary: dict) -> str:
    title = f"{summary['strategy']} · {summary['workload']} · {summary['model']} · {summary['runner']}"
    width = max(len(name) for name, _ in TERMINAL_ROWS)
    lines = [title, "-" * len(title)] + [f"{name:<{width}}  {fmt(summary)}" for name, fmt in TERMINAL_ROWS]
    return "\n".join(lines)


def run_report(summary: dict, requests: pd.DataFrame, steps: pd.DataFrame, workload_info: dict,
               plots: list) -> str:
    rejected = requests[requests.status == "rejected"]
    composition = pd.DataFrame({
        "tokens": [steps.num_prefill_tokens.sum(), steps.num_decode_tokens.sum(), steps.num_padding_tokens.sum()],
    }, index=["prefill", "decode", "padding"])
    composition["share"] = (composition.tokens / composition.tokens.sum()).map("{:.1%}".format)
    parts = [
        f"# {summary['strategy']} on {summary['workload']}",
        "",
        "```",
        terminal_table(summary),
        "```",
        "",
        "## Workload",
        "",
        *[f"- {key}: {value}" for key, value in workload_info.items()],
        "",
        "## What the model computed",
        "",
        "Every token slot the model ran, by kind. Padding is compute spent on no request's sequence.",
        "",
        composition.to_markdown(),
        "",
        f"{summary['num_steps']} steps; see `steps.csv` for each one and `requests.csv` for each request.",
        "",
        "## Plots",
        "",
        *[f"![{p.stem}]({p.as_posix()})" for p in plots],
        "",
        "## Environment",
        "",
        *[f"- {key}: {summary.get(key)}" for key in ENVIRONMENT_KEYS],
    ]
    if len(rejected):
        parts += ["", "## Rejected requests", "", *[
            f"- request {row.request_id}: {row.reject_reason}" for row in rejected.itertuples()
        ]]
    return "\n".join(parts) + "\n"

