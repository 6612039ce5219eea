"""What a workload looks like before it runs: counts, length percentiles, arrival rate and burstiness, and a
picture of its lengths and arrivals."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from workloads.spec import Workload


def workload_stats(workload: Workload) -> dict:
    prompts = np.array([r.prompt_len for r in workload.requests])
    outputs = np.array([r.max_new_tokens for r in workload.requests])
    arrivals = np.array([r.arrival_s for r in workload.requests])
    gaps = np.diff(arrivals)
    span = arrivals[-1] - arrivals[0]
    cv = gaps.std() / gaps.mean() if len(gaps) and gaps.mean() > 0 else float("nan")
    stats = {"requests": len(prompts), "prompt tokens": int(prompts.sum()), "output tokens": int(outputs.sum())}
    for name, values in (("prompt", prompts), ("output", outputs)):
        stats |= {f"{name} mean": float(values.mean())} | {
            f"{name} p{p}": float(np.percentile(values, p)) for p in (0, 50, 90, 99, 100)
        }
    stats |= {
        "arrival span s": float(span),
        "arrival rate req/s": (len(arrivals) - 1) / span if span > 0 else float("inf"),
        "inter-arrival CV": float(cv),
        # A gamma process with shape k has CV 1/sqrt(k): this is the burstiness a gamma fit would give.
        "burstiness (1/CV^2)": float(1 / cv**2) if cv and cv == cv else float("nan"),
    }
    return stats


def plot_workload(workload: Workload, path: Path) -> None:
    prompts = [r.prompt_len for r in workload.requests]
    outputs = [r.max_new_tokens for r in workload.requests]
    arrivals = [r.arrival_s for r in workload.requests]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].hist(prompts, bins=40, color="tab:blue")
    axes[0].set(title="Prompt length", xlabel="tokens", ylabel="requests")
    axes[1].hist(outputs, bins=40, color="tab:orange")
    axes[1].set(title="Output length", xlabel="tokens", ylabel="requests")
    axes[2].plot(arrivals, np.arange(1, len(arrivals) + 1), drawstyle="steps-post")
    axes[2].set(title="Arrivals", xlabel="time (s)", ylabel="requests arrived")
    fig.suptitle(f"workload {workload.name}: {workload.info.get('source', '')}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
