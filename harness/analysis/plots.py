"""A run's pictures: what each step computed, KV use, the prefix cache, latency CDFs and a per-request timeline."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.analysis.results import write_png
from strategies import RequestStatus

COLORS = {"prefill": "tab:blue", "decode": "tab:green", "padding": "tab:red", "queued": "0.8", "held": "0.93"}
GANTT_MAX_REQUESTS = 64
# Points a line is drawn with: a million steps or requests become this many evenly spaced ones (a PNG 1100 pixels
# wide shows no more), so a week-long trace plots in a second.
MAX_POINTS = 4000


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    write_png(path, fig)
    plt.close(fig)


def thinned(frame: pd.DataFrame) -> pd.DataFrame:
    """Every k-th row, at most MAX_POINTS of them (the last row kept)."""
    if len(frame) <= MAX_POINTS:
        return frame
    return frame.iloc[np.unique(np.linspace(0, len(frame) - 1, MAX_POINTS).astype(int))]


def step_composition(steps: pd.DataFrame, title: str, path: Path, bins: int = 120) -> None:
    """Where the compute went over time. Top: share of computed token slots that were prefill, decode or padding
    (padding is compute spent on no request). Bottom: tokens computed per step."""
    end = float((steps.start_s + steps.duration_s).max())
    edges = np.linspace(float(steps.start_s.min()), end, bins + 1)
    which = np.clip(np.digitize(steps.start_s, edges) - 1, 0, bins - 1)
    kinds = {"prefill": steps.num_prefill_tokens, "decode": steps.num_decode_tokens,
             "padding": steps.num_padding_tokens}
    sums = {k: np.bincount(which, weights=v, minlength=bins) for k, v in kinds.items()}
    total = sum(sums.values())
    busy = total > 0
    centers = ((edges[:-1] + edges[1:]) / 2)[busy]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True, height_ratios=[3, 2])
    top.stackplot(centers, *[100 * sums[k][busy] / total[busy] for k in kinds], labels=list(kinds),
                  colors=[COLORS[k] for k in kinds], alpha=0.85)
    top.set(title=f"Where the compute went: {title}", ylabel="share of computed slots (%)", ylim=(0, 100))
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    drawn = thinned(steps)
    bottom.step(drawn.start_s, drawn.num_computed_tokens, where="post", color="0.3", lw=0.8)
    bottom.set(xlabel="time (s)", ylabel="tokens per step", yscale="log", xlim=(edges[0], end))
    bottom.grid(alpha=0.3)
    save_figure(fig, path)


def kv_usage(steps: pd.DataFrame, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    drawn = thinned(steps)
    ax.step(drawn.start_s, 100 * drawn.kv_utilization, where="post", color="tab:purple", label="KV blocks in use")
    preempting = steps[steps.num_preempted > 0]
    if len(preempting):
        shown = thinned(preempting)
        ax.scatter(shown.start_s, 100 * shown.kv_utilization, marker="v", color="tab:red", zorder=3,
                   label=f"preemption ({int(preempting.num_preempted.sum())})")
    ax.set(title=f"KV cache use: {title}", xlabel="time (s)", ylabel="blocks in use (%)", ylim=(0, 105))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)


def prefix_cache(steps: pd.DataFrame, num_blocks: int, title: str, path: Path, bins: int = 60) -> None:
    """The prefix cache over time. Top: the share of admitted prompt tokens found cached, per time bin and so far.
    Bottom: blocks held by running requests, and named blocks the cache keeps (held or evictable): when the two
    meet the free blocks are gone, and admitting more evicts the prefixes that made requests cheap."""
    end = float((steps.start_s + steps.duration_s).max())
    edges = np.linspace(float(steps.start_s.min()), end, bins + 1)
    which = np.clip(np.digitize(steps.start_s, edges) - 1, 0, bins - 1)
    looked = np.bincount(which, weights=steps.num_lookup_tokens, minlength=bins)
    cached = np.bincount(which, weights=steps.num_cached_tokens, minlength=bins)
    some = looked > 0
    centers = (edges[:-1] + edges[1:]) / 2
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True)
    top.bar(centers[some], 100 * cached[some] / looked[some], width=(end - edges[0]) / bins, color="tab:olive",
            alpha=0.6, label="in this interval")
    so_far = 100 * np.cumsum(cached) / np.maximum(np.cumsum(looked), 1)
    top.step(centers, so_far, where="mid", color="tab:olive", label="since the start")
    top.set(title=f"Prefix cache: {title}", ylabel="prompt tokens hit (%)", ylim=(0, 105))
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    drawn = thinned(steps)
    bottom.step(drawn.start_s, 100 * drawn.kv_used_blocks / num_blocks, where="post", color="tab:purple",
                label="held by requests")
    bottom.step(drawn.start_s, 100 * drawn.kv_cached_blocks / num_blocks, where="post", color="tab:olive",
                label="cached prefixes")
    bottom.set(xlabel="time (s)", ylabel="KV blocks (%)", ylim=(0, 105), xlim=(edges[0], end))
    bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)


def latency_cdfs(requests: pd.DataFrame, title: str, path: Path) -> None:
    finished = requests[requests.status == RequestStatus.FINISHED.label]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, column, label in ((axes[0], "ttft_s", "time to first token"), (axes[1], "e2e_s", "end-to-end latency")):
        values = np.sort(finished[column].dropna().to_numpy())
        fractions = np.arange(1, len(values) + 1) / max(len(values), 1)
        if len(values) > MAX_POINTS:  # evenly spaced ranks, the largest kept
            ranks = np.unique(np.linspace(0, len(values) - 1, MAX_POINTS).astype(int))
            values, fractions = values[ranks], fractions[ranks]
        ax.step(values, fractions, where="post")
        ax.set(title=label, xlabel="seconds", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        if len(values) and values.min() > 0 and values.max() / values.min() > 100:
            ax.set_xscale("log")  # spans orders of magnitude: a linear axis hides the fast requests
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def request_gantt(requests: pd.DataFrame, title: str, path: Path) -> None:
    """Held by the client, queued, prefill (until the first token) and decode spans of the first requests."""
    finished = requests[requests.status == RequestStatus.FINISHED.label]
    sample = finished.sort_values("request_id").head(GANTT_MAX_REQUESTS)
    if sample.empty:
        return
    # A server does not say when it scheduled a request: its wait shows as queued until the first token.
    scheduled = sample.first_scheduled_s.fillna(sample.first_token_s)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.11 * max(len(sample), 8)))
    rows = np.arange(len(sample))
    spans = [("held", sample.arrival_s, sample.sent_s),
             ("queued", sample.sent_s, scheduled),
             ("prefill", scheduled, sample.first_token_s),
             ("decode", sample.first_token_s, sample.finish_s)]
    for name, start, end in spans:
        ax.barh(rows, (end - start).to_numpy(), left=start.to_numpy(), height=0.8, color=COLORS[name], label=name)
    ax.set_yticks(rows[:: max(1, len(rows) // 16)], sample.request_id.to_numpy()[:: max(1, len(rows) // 16)])
    ax.set_ylim(len(sample) - 0.5, -0.5)  # first request on top
    ax.set(title=f"Requests over time: {title}", xlabel="time (s)", ylabel="request")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)


def plot_run(requests: pd.DataFrame, steps: pd.DataFrame, title: str, plots_dir: Path,
             num_blocks: int | None = None) -> list[Path]:
    """The run's plots that apply (no steps from a peer; no prefix-cache plot where the cache found nothing)."""
    names = ("steps.png", "kv_cache.png", "prefix_cache.png", "latency_cdf.png", "requests.png")
    paths = [plots_dir / name for name in names]
    if len(steps):
        step_composition(steps, title, paths[0])
        kv_usage(steps, title, paths[1])
        if num_blocks and steps.num_cached_tokens.any():
            prefix_cache(steps, num_blocks, title, paths[2])
    latency_cdfs(requests, title, paths[3])
    request_gantt(requests, title, paths[4])
    return [p for p in paths if p.exists()]
