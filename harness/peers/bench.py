"""Benchmark: our strategies against transformers' own batching, in one process, in interleaved rounds.

    python -m harness.peers.bench [--rounds 3] [--requests 48] [--concurrency 16]

Same model, workload (the ShareGPT length profile), closed-loop client and thread count for every system; each
round runs every system once, in order, so drift on a shared machine hits all of them alike. Prints each
system's median output throughput and TTFT p50 with their spread (min-max over rounds), and the ratios the
peers issue asks for. A benchmark, not a test: it asserts nothing.
"""

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

import torch

from harness.config import compose_config
from harness.job import run_job

# (name, overrides): ours first, then the peers doing the same job.
SYSTEMS = [("static", ["strategy=static"]), ("continuous", ["strategy=continuous"]),
           ("hf_generate", ["runner=hf_generate"]), ("hf_continuous", ["runner=hf_continuous"])]
# (numerator, denominator, target): ours against the peer that does the same job.
RATIOS = [("continuous", "hf_continuous", 1.5), ("continuous", "hf_generate", 2.5), ("static", "hf_generate", 1.0)]


def run_round(systems: list, workload: list[str], out: Path, round_index: int) -> dict[str, dict]:
    results = {}
    for name, overrides in systems:
        cfg = compose_config([*overrides, *workload, "progress=false"])
        results[name] = run_job(cfg, out / f"{round_index}-{name}")
    return results


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--systems", nargs="+", choices=[name for name, _ in SYSTEMS],
                        default=[name for name, _ in SYSTEMS], help="a subset, e.g. static hf_generate")
    args = parser.parse_args()
    systems = [(name, overrides) for name, overrides in SYSTEMS if name in args.systems]
    logging.disable(logging.INFO)
    workload = ["workload=sharegpt", f"workload.num_requests={args.requests}",
                f"workload.max_concurrency={args.concurrency}", f"concurrency={args.concurrency}"]
    rounds = []
    with tempfile.TemporaryDirectory() as out:
        for i in range(args.rounds):
            rounds.append(run_round(systems, workload, Path(out), i))
    print(f"\n{args.rounds} interleaved rounds, {args.requests} ShareGPT-profile requests, client concurrency "
          f"{args.concurrency}, {torch.get_num_threads()} threads; median (min-max)")
    throughput = {name: [r[name]["output_throughput_tps"] for r in rounds] for name, _ in systems}
    ttft = {name: [r[name]["ttft_s_p50"] for r in rounds] for name, _ in systems}
    for name, _ in systems:
        print(f"  {name:<14} {spread(throughput[name], '{:.0f}')} output tok/s   TTFT p50 "
              f"{spread([1e3 * t for t in ttft[name]], '{:.0f}')} ms")
    unquiet = [(i, name, r[name]["measurement_warning"]) for i, r in enumerate(rounds) for name, _ in systems
               if r[name].get("measurement_warning")]
    for i, name, warning in unquiet:
        print(f"  warning: round {i + 1}, {name}: {warning}")
    if not unquiet:
        print("  every run on a quiet machine (other work and step spread within what a quiet machine shows)")
    for ours, peer, target in RATIOS:
        if ours not in throughput or peer not in throughput:
            continue
        ratios = [a / b for a, b in zip(throughput[ours], throughput[peer])]  # within a round: side by side
        verdict = "meets" if statistics.median(ratios) >= target else "misses"
        print(f"  {ours} / {peer}: {spread(ratios, '{:.2f}')}x output throughput ({verdict} the {target}x target)")


if __name__ == "__main__":
    main()
