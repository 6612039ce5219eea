"""Benchmark: our continuous batching beside vLLM's V1 scheduler, on the same model, workload, caps, cores and threads.

    python -m harness.peers.scheduler_bench [--concurrency 1 4 16] [--requests 64] [--rounds 3] [--out DIR]

One vLLM server as `system=vllm` starts it (`bash scripts/install-vllm.sh` first; prefix caching off in both, so
that repeated rounds compute the same prompts afresh), and our `strategy=continuous` set to that server's settings:
block size 32, the same `max_num_seqs` and `max_batch_tokens`, chunked prefill with decodes first (vLLM V1's
policy). On each closed-loop load both run the
same requests, interleaved over rounds. Prints, per load, the median over rounds of what each scheduler did (steps,
tokens a step, running requests, preemptions) and what it achieved (output tok/s, TTFT p50, TPOT p50), our
throughput over vLLM's, and the wall time a step took each, ours split into the model's forward and the harness's own
work. Writes the table (`scheduler_bench.csv`) and a plot (`scheduler_bench.png`) into --out. A benchmark, not a
test: it asserts nothing.

vLLM's figures are its own (`/metrics`, see `harness.peers.server_metrics`); its running count is sampled every
second, ours is the mean over steps.
"""

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.analysis.plots import save_figure
from harness.config import compose_config
from harness.job import run_job
from harness.peers.vllm import started_vllm

# Row label → (our summary key, vLLM's summary key), per step or per run.
FIGURES = {
    "steps": ("num_steps", "server_iterations"),
    "tokens a step": ("tokens_per_step_mean", "server_tokens_per_iteration"),
    "running requests": ("batch_size_mean", "server_running_mean"),
    "preemptions": ("num_preemptions", "server_preemptions"),
    "output tok/s": ("output_throughput_tps", "output_throughput_tps"),
    "TTFT p50 ms": ("ttft_s_p50", "ttft_s_p50"),
    "TPOT p50 ms": ("tpot_s_p50", "tpot_s_p50"),
}
MILLISECONDS = {"TTFT p50 ms", "TPOT p50 ms"}


def one_load(concurrency: int, args, url: str, model_path: str, out: Path, rounds: int) -> list[dict]:
    workload = ["workload=random", f"workload.input_len={args.input_len}", f"workload.output_len={args.output_len}",
                f"workload.num_requests={args.requests}", f"workload.max_concurrency={concurrency}", "progress=false"]
    systems = {
        "batchlab": ["strategy=continuous", "kv_cache.block_size=32", "kv_cache.prefix_caching=false"],
        "vllm": ["runner=openai", f"runner.url={url}", f"runner.model={model_path}"],
    }
    rows = []
    for i in range(rounds):
        order = list(systems) if i % 2 == 0 else list(systems)[::-1]  # drift on a shared machine hits both alike
        summaries = {name: run_job(compose_config([*systems[name], *workload]), out / f"c{concurrency}-{i}-{name}")
                     for name in order}
        rows.append(row(concurrency, summaries["batchlab"], summaries["vllm"]))
    return rows


def row(concurrency: int, ours: dict, theirs: dict) -> dict:
    figures = {"concurrency": concurrency}
    for label, (our_key, their_key) in FIGURES.items():
        scale = 1e3 if label in MILLISECONDS else 1.0
        figures[f"{label} (batchlab)"] = ours[our_key] * scale
        figures[f"{label} (vllm)"] = None if theirs[their_key] is None else theirs[their_key] * scale
    figures["batchlab / vllm output tok/s"] = ours["output_throughput_tps"] / theirs["output_throughput_tps"]
    # Wall time a step: the run's span over its steps. Ours splits it into the model's forward (busy), the
    # harness's own scheduling and bookkeeping (overhead), and waiting for the client (the rest).
    figures["ms a step (batchlab)"] = 1e3 * ours["makespan_s"] / ours["num_steps"]
    figures["ms a step: forward (batchlab)"] = 1e3 * ours["busy_s"] / ours["num_steps"]
    figures["ms a step: harness (batchlab)"] = 1e3 * ours["overhead_s"] / ours["num_steps"]
    iterations = theirs["server_iterations"]
    figures["ms a step (vllm)"] = 1e3 * theirs["makespan_s"] / iterations if iterations else None
    return figures


def plot(table: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, label in zip(axes, ["tokens a step", "running requests", "ms a step"]):
        frame = table.set_index("concurrency")[[f"{label} (batchlab)", f"{label} (vllm)"]]
        frame.columns = ["batchlab continuous", "vLLM V1"]
        frame.plot.bar(ax=ax, rot=0)
        ax.set_title(label)
        ax.set_xlabel("client concurrency")
    fig.suptitle("Our continuous batching beside vLLM's scheduler (same model, caps, cores; median of rounds)")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("results") / "scheduler_bench")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        # Without prefix caching: repeated rounds compute the same prompts afresh.
        with started_vllm(compose_config(["system=vllm", "kv_cache.prefix_caching=false"]), out) as (url, model_path):
            for concurrency in args.concurrency:
                rows += one_load(concurrency, args, url, model_path, out, args.rounds)
    table = pd.DataFrame(rows).groupby("concurrency").median().reset_index()
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "scheduler_bench.csv", index=False)
    plot(table, args.out / "scheduler_bench.png")
    shown = table.set_index("concurrency").T
    print(f"\n{args.rounds} interleaved rounds a load, {args.requests} requests of {args.input_len} prompt / "
          f"{args.output_len} output tokens, closed loop; median over rounds")
    print(shown.to_string(float_format=lambda x: f"{x:.2f}"))
    ratios = [r["batchlab / vllm output tok/s"] for r in rows]
    print(f"batchlab / vllm output tok/s over every round and load: median {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"table: {args.out / 'scheduler_bench.csv'}  plot: {args.out / 'scheduler_bench.png'}")


if __name__ == "__main__":
    main()
