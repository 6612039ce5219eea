"""The prepared GPU check: `python -m harness.gpu_check [--dry-run] [--out DIR]`.

One run on one GPU (3 minutes on an H200, 2026-12-04), five sections, one folder:
1. kernels: the kernel tests on the device, Triton compiled (the interpreter off);
2. oracle: every strategy's greedy tokens against `generate()` on the device, in fp32 (exact) and in bf16 (tokens
   equal up to the first near-tie, logits within bf16 error until then; both bounds defined below);
3. kernel bench: the Triton kernel against the torch reference, SDPA per sequence and FlashAttention if installed;
4. dense GEMMs: the GEMMs of a step of seven dense models (Qwen3-0.6B to Llama-3.1-70B, `--gemm-models`) in BF16
   and FP8 (one layer's weights, timed as a CUDA graph), beside the roofline's time for them on this GPU's
   catalogue entry, each weight matrix's streaming rate, and the decode steps fitted as one stream rate and a fixed
   time per GEMM (`harness.dense_gemms`);
5. strategies: static, dynamic and continuous on random-weight 1B- and 8B-shaped Llamas with the ShareGPT profile
   (tok/s, TTFT, padding waste, busy and overhead time), each beside the roofline simulator's prediction of the
   same run on this GPU's catalogue entry.
It writes `summary.md` and `summary.json` after each section (a run stopped at a lease's time limit keeps what it
measured; a section that fails records its error and the next one runs) and exits non-zero if any section failed
or the kernels or the oracle did not pass.

`--dry-run` runs the same sections on this CPU with tiny shapes and the torch reference (kernels interpreted), so
the check cannot rot between GPU sessions: CI runs it (tests/test_gpu_check.py).
"""

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from harness.analysis.results import write_text
from workloads import RequestSpec

# bf16 keeps 8 bits of mantissa: a logit of magnitude m is known to about m * 2^-8. Ours and generate()'s
# round differently along 2 x layers matmuls, so logits may differ by a few such units; a token choice may
# differ only where the reference's top two logits are that close (a near-tie).
BF16_UNIT = 2**-8
BF16_LOGIT_TOLERANCE = 16 * BF16_UNIT  # x the largest |logit| of the step
BF16_NEAR_TIE = 16 * BF16_UNIT  # x the largest |logit| of the step
ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("kernels", "oracle", "kernel_bench", "dense_gemms", "strategies")
# Dense models from 0.6B to 70B, so the decode steps' fit of a stream rate and a fixed time per GEMM rests on many
# matrix sizes; the Qwen3s are the shapes most published runs the simulator is fitted on served.
GEMM_MODELS = ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b", "llama-3.1-8b", "qwen3-14b", "qwen3-32b", "llama-3.1-70b")


def check_kernels(device: str) -> dict:
    """The kernel tests, as CI runs them but on `device` (CI interprets them on a CPU). A dry run checks this
    section with one of them, the mixed batch in fp32: CI runs them all, interpreted, already."""
    env = dict(os.environ)
    if device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    chosen = ["-k", "matches_reference_fp32 and mixed"] if device == "cpu" else []
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/ragged_kernels",
                             *chosen], cwd=ROOT, env=env, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-300:]
    return {"passed": result.returncode == 0, "result": tail, "seconds": round(time.perf_counter() - start, 1)}


def check_oracle(device: str, dtype: torch.dtype, lengths: list[tuple[int, int]]) -> list[dict]:
    """Each strategy's tokens against `generate()` per request, on tiny-llama in `dtype`."""
    from harness.config import compose_config
    from harness.core.replica import build_replica
    from harness.real.model import build_random_model, model_config
    from harness.real.runner import RealRunner

    model_cfg = compose_config([]).model
    ours = build_random_model(model_config(model_cfg), model_cfg.seed, device, dtype).eval()
    reference = build_random_model(model_config(model_cfg), model_cfg.seed, device, dtype).eval()
    reference.set_attn_implementation("sdpa")
    gen = torch.Generator().manual_seed(0)
    specs = [RequestSpec(i, 0.0, tuple(torch.randint(0, 8192, (p,), generator=gen).tolist()), n)
             for i, (p, n) in enumerate(lengths)]
    expected = {}
    for spec in specs:
        out = reference.generate(torch.tensor([spec.prompt_ids], device=device), max_new_tokens=spec.max_new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
        expected[spec.request_id] = (out.sequences[0, len(spec.prompt_ids):].tolist(),
                                     torch.stack([step[0] for step in out.logits]).float())
    rows = []
    for strategy, options in (("static", {"batch_size": 3}), ("dynamic", {"batch_size": 3}),
                              ("continuous", {"max_batch_tokens": 16, "max_num_seqs": 4})):
        kept: dict[int, list] = {}
        engine = build_replica(strategy, options, lambda a, kept=kept: KeptLogits(RealRunner(ours, a, True), kept),
                               num_blocks=256, block_size=4, max_model_len=2048)
        records = engine.run(specs)
        rows.append(_compare(strategy, str(dtype).removeprefix("torch."), records, kept, expected,
                             exact=dtype == torch.float32))
    return rows


class KeptLogits:
    """The real runner, keeping every sampled token's logits row per request for the comparison."""

    measures_wall_time = True

    def __init__(self, runner, kept: dict[int, list]):
        self.runner, self.kept = runner, kept

    def execute(self, plan):
        result = self.runner.execute(plan)
        for request_id, row in result.logits.items():
            self.kept.setdefault(request_id, []).append(row)
        return result


def _compare(strategy: str, dtype: str, records, logits: dict, expected: dict, exact: bool) -> dict:
    """fp32: every token equal. bf16: tokens equal up to the first near-tie (where the run may then diverge), and
    logits within `BF16_LOGIT_TOLERANCE` of the reference's until there."""
    equal = near_ties = mismatches = 0
    worst = 0.0
    for request in records.requests:
        tokens, reference = expected[request.request_id]
        ours = torch.stack(logits[request.request_id]).float().to(reference.device)  # [N, V]
        for t, (mine, theirs) in enumerate(zip(request.output_ids, tokens)):
            scale = reference[t].abs().max().item()
            worst = max(worst, (ours[t] - reference[t]).abs().max().item() / scale)
            if mine == theirs:
                continue
            gap = (reference[t, theirs] - reference[t, mine]).item() / scale
            if not exact and gap <= BF16_NEAR_TIE:
                near_ties += 1
            else:
                mismatches += 1
            break
        else:
            equal += 1
    within = exact or worst <= BF16_LOGIT_TOLERANCE
    return {"strategy": strategy, "dtype": dtype, "requests_equal": equal, "near_ties": near_ties,
            "mismatches": mismatches, "max_logit_error_rel": worst, "passed": mismatches == 0 and within}


def check_bench(dry_run: bool) -> dict:
    from harness.machine_load import MachineLoad, machine_line
    from ragged_kernels.bench import run_bench

    shape = dict(decodes=4, ctx_min=32, ctx_max=64, prefill=16, prefill_ctx=32, heads=4, kv_heads=2, head_dim=32,
                 dtype="float32", iters=3) if dry_run else {}
    with MachineLoad(torch.get_num_threads()) as machine:
        times = run_bench(**shape)
    base = times.get("triton", times["torch reference"])
    print(machine_line(machine))
    return {name: {"ms": 1e3 * t, "x_of_base": t / base} for name, t in times.items()}


def check_dense_gemms(models: list[str], hardware: str, device: str, formats: list[str], tokens: list[int],
                      reps: int) -> dict:
    """Each model's dense GEMMs in each weight format, timed here beside the roofline's time for them on `hardware`
    with the default engine profile, and each weight matrix's streaming rate at the fewest tokens
    (`harness.dense_gemms`)."""
    from harness.config import compose_config
    from harness.dense_gemms import decode_fits, measure, streaming
    from harness.sim.costmodel.hardware import get_hardware

    bandwidth = get_hardware(hardware).memory_bandwidth
    step, streamed = [], []
    for model in models:
        cfg = compose_config([f"model={model}", "runner=sim", f"runner.hardware={hardware}"])
        step += [{"model": model, "engine": cfg.runner.engine} | row
                 for row in measure(cfg.model, cfg.runner, device, formats, tokens, reps)]
        streamed += [{"model": model} | row
                     for row in streaming(cfg.model, bandwidth, device, formats, tokens[0], reps)]
    return {"step": step, "streaming": streamed, "decode_fit": decode_fits(step, bandwidth)}


def check_strategies(models: list[str], device: str, hardware: str | None, workload: list[str],
                     out: Path) -> list[dict]:
    """Each strategy on each random-weight model, and the roofline's prediction of the same run beside it: its
    throughput (with the default engine profile's host costs, not this harness's) and its busy time (the GPU's
    alone, which this runner's busy time also holds its launches in). A run that fails leaves a row saying why."""
    from harness.config import compose_config
    from harness.job import run_job

    real_keys = [f"device={device}", "dtype=bfloat16" if device == "cuda" else "dtype=float32"]
    rows = []
    for model in models:
        for strategy in ("static", "dynamic", "continuous"):
            common = [f"model={model}", f"strategy={strategy}", *workload, "progress=false"]
            row = {"model": model, "strategy": strategy}
            try:
                real = run_job(compose_config([*common, *real_keys]), out / "runs" / f"{model}-{strategy}")
                row |= {"output_tok_s": real["output_throughput_tps"], "ttft_p50_s": real["ttft_s_p50"],
                        "tpot_p50_s": real["tpot_s_p50"], "padding_waste": real["padding_waste"],
                        "busy_s": real["busy_s"], "overhead_s": real["overhead_s"], "num_blocks": real["num_blocks"],
                        "quiet": real["measurement_warning"] is None}
                if hardware:
                    sim = run_job(compose_config([*common, "runner=sim", f"runner.hardware={hardware}"]),
                                  out / "runs" / f"{model}-{strategy}-sim")
                    row |= {"sim_output_tok_s": sim["output_throughput_tps"], "sim_ttft_p50_s": sim["ttft_s_p50"],
                            "sim_vs_real_tok_s": sim["output_throughput_tps"] / real["output_throughput_tps"],
                            "sim_busy_s": sim["busy_s"], "sim_vs_real_busy": sim["busy_s"] / real["busy_s"]}
            except Exception as e:  # the other runs' figures are what a rare GPU lease is for
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(row)
            print(f"gpu check: {model} {strategy}: {row}", flush=True)
            gc.collect()  # the model and its KV cache, before the next run sizes its cache from free memory
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="this CPU, tiny shapes, the torch reference")
    parser.add_argument("--out", type=Path, default=None, help="default results/gpu_check/<time>")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                        help="run only these (a rerun of one that failed); default all")
    parser.add_argument("--gemm-models", nargs="+", default=list(GEMM_MODELS), metavar="MODEL",
                        help="catalogue models whose dense GEMMs are timed (on a GPU); default: "
                        + " ".join(GEMM_MODELS))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.dry_run:
        raise SystemExit("error: no CUDA device; use --dry-run to check the check on this CPU")
    out = args.out or ROOT / "results" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        models, hardware = ["tiny-llama"], "cpu"
        workload = ["workload=sharegpt", "workload.num_requests=6", "workload.max_output_len=16", "concurrency=4"]
        lengths = [(11, 6), (1, 5), (23, 3), (5, 1)]
        gemms = dict(models=["tiny-llama"], formats=["bf16", "fp8"], tokens=[16, 64], reps=2)
    else:
        from harness.sim.costmodel.hardware import catalogue_name

        props = torch.cuda.get_device_properties(0)
        models, hardware = ["llama-3.2-1b", "llama-3.1-8b"], catalogue_name(props.name, props.total_memory)
        workload = ["workload=sharegpt", "workload.num_requests=64", "workload.max_output_len=256"]
        lengths = [(11, 6), (1, 5), (23, 3), (5, 1), (17, 9), (8, 4), (300, 40)]
        fp8 = torch.cuda.get_device_capability(0) >= (8, 9)  # FP8 tensor cores: Ada, Hopper and later
        gemms = dict(models=args.gemm_models, formats=["bf16", "fp8"] if fp8 else ["bf16"],
                     tokens=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], reps=20)
    summary = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
               "torch": torch.__version__, "hardware_entry": hardware, "seconds": {}}
    dtypes = [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]
    sections = {
        "kernels": lambda: check_kernels(device),
        "oracle": lambda: [row for dtype in dtypes for row in check_oracle(device, dtype, lengths)],
        "kernel_bench": lambda: check_bench(args.dry_run),
        "dense_gemms": lambda: check_dense_gemms(hardware=hardware, device=device, **gemms) if hardware else {},
        "strategies": lambda: check_strategies(models, device, hardware, workload, out),
    }
    for name in args.sections:
        run = sections[name]
        print(f"gpu check: {name} ...", flush=True)
        start = time.perf_counter()
        try:
            summary[name] = run()
        except Exception:  # as above: the later sections still run and report
            summary[name] = {"error": traceback.format_exc(limit=-6)}
        summary["seconds"][name] = round(time.perf_counter() - start, 1)
        # After each section, so a run stopped at its time limit still leaves what it measured.
        write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        write_text(out / "summary.md", _markdown(summary))
    print(_markdown(summary))
    print(f"gpu check: {out}")
    failed = [name for name in args.sections if not _passed(name, summary[name])]
    if failed:
        print(f"gpu check: failed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


def _passed(section: str, result) -> bool:
    """A section passed: it ran to the end, and the kernels' tests and the oracle's comparisons passed."""
    if isinstance(result, dict) and "error" in result:
        return False
    if section == "kernels":
        return result["passed"]
    return section != "oracle" or all(row["passed"] for row in result)


def _table(rows, **options) -> str:
    if isinstance(rows, dict) and "error" in rows:
        return f"failed:\n\n```\n{rows['error']}```"
    return pd.DataFrame(rows).to_markdown(index=False, **options) if rows else "(not run)"


def _markdown(summary: dict) -> str:
    """The sections measured so far, each a table or the error that stopped it."""
    parts = [f"# GPU check: {summary['device']} (torch {summary['torch']}, roofline entry "
             f"{summary['hardware_entry']})", "", f"Seconds per section: {summary['seconds']}", ""]
    if "kernels" in summary:
        kernels = summary["kernels"]
        parts += ["## Kernels", "", _table(kernels) if "error" in kernels else
                  f"{kernels['result']} ({kernels['seconds']} s)", ""]
    if "oracle" in summary:
        parts += ["## Oracle against generate()", "", _table(summary["oracle"]), ""]
    if "kernel_bench" in summary:
        bench = summary["kernel_bench"]
        table = _table(bench) if "error" in bench else pd.DataFrame(bench).T.to_markdown(floatfmt=".3g")
        parts += ["## Kernel bench (one continuous-batching step)", "", table, ""]
    if "dense_gemms" in summary:
        gemms = summary["dense_gemms"]
        parts += ["## Dense GEMMs of a decode step, measured beside the roofline", ""]
        parts += [_table(gemms), ""] if "error" in gemms else [
            _table(gemms["step"], floatfmt=".4g"), "", "Each weight matrix alone, streamed:", "",
            _table(gemms["streaming"], floatfmt=".4g"), ""]
        if gemms.get("decode_fit"):
            parts += ["The models' decode steps as one stream rate and a fixed time per GEMM:", "",
                      _table(gemms["decode_fit"], floatfmt=".4g"), "", *_hardware_lines(summary), ""]
    if "strategies" in summary:
        parts += ["## Strategies, real beside simulated", "", _table(summary["strategies"], floatfmt=".4g"), ""]
    return "\n".join(parts)


def _hardware_lines(summary: dict) -> list[str]:
    """The BF16 fit as the two lines of a hardware file that hold it (`HardwareSpec.stream_bandwidth_gbps`,
    `gemm_fixed_us`), for this GPU's catalogue entry."""
    bf16 = next((fit for fit in summary["dense_gemms"]["decode_fit"] if fit["format"] == "bf16"), None)
    if bf16 is None:
        return []
    return [f"For `conf/hardware/{summary['hardware_entry']}.yaml` (BF16, {bf16['models']} models):", "", "```yaml",
            f"stream_bandwidth_gbps: {1e3 * bf16['stream_tb_s']:.0f}", f"gemm_fixed_us: {bf16['per_gemm_us']:.1f}",
            "```"]


if __name__ == "__main__":
    main()
