"""The files a finished run leaves in its folder, ours or a peer's, and the table it prints at the end."""

import json
import sys
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from harness.analysis.report import run_report, terminal_table
from harness.analysis.results import RunInterrupted, write_json, write_table, write_text
from harness.config import RunConfig
from harness.core.prefix_cache import prompt_block_hashes
from strategies import Request
from workloads.traces import MOONCAKE_BLOCK_TOKENS


def write_results(run_dir: Path, raw: DictConfig, cfg: RunConfig, records: list[Request], requests: pd.DataFrame,
                  steps: pd.DataFrame | None, summary: dict, workload_info: dict) -> None:
    """Every file of a finished run. `steps` None: a peer, which reports no steps (no step table)."""
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(raw, resolve=True))
    tables = [write_table(run_dir, "requests", requests, cfg.results.tables)]
    if steps is not None and cfg.results.steps == "full":
        tables.append(write_table(run_dir, "steps", steps, cfg.results.tables))
    if cfg.save_tokens:
        lines = [json.dumps({"request_id": r.request_id, "status": r.status.label,
                             "prompt_ids": r.token_ids[:r.num_prompt_tokens], "output_ids": r.output_ids})
                 for r in sorted(records, key=lambda r: r.request_id)]
        write_text(run_dir / "tokens.jsonl", "\n".join(lines) + "\n")
    if cfg.save_trace:
        write_text(run_dir / "trace.jsonl", mooncake_trace(records))
    title = f"{summary['strategy']} on {summary['workload']}"
    # matplotlib is imported here, where a run draws: a run refused at its config answers 0.6 s sooner without it.
    from harness.analysis.plots import plot_run

    plots = plot_run(requests, steps if steps is not None else pd.DataFrame(), title, run_dir / "plots",
                     summary.get("num_blocks"))
    write_text(run_dir / "report.md", run_report(summary, requests, steps, workload_info,
                                                 [p.relative_to(run_dir) for p in plots], tables))
    write_json(run_dir / "summary.json", summary)  # last: its presence means the run is complete


def mooncake_trace(records: list[Request]) -> str:
    """What the run sent, as a Mooncake-format trace (`workload=mooncake` reads it back): one JSON line a request, in
    the order sent: the send time (ms), prompt and output lengths, and a hash id per 512-token prompt block, shared
    by requests whose prompts agree up to that block's end (numbered in order of first use)."""
    ids: dict[int, int] = {}
    lines = []
    for r in sorted(records, key=lambda r: (r.sent_s, r.request_id)):
        hashes = prompt_block_hashes(r, MOONCAKE_BLOCK_TOKENS)
        if r.num_prompt_tokens % MOONCAKE_BLOCK_TOKENS:  # the last block, partly filled: this request's own
            hashes.append(hash((hashes[-1] if hashes else None, -1, r.request_id)))
        lines.append(json.dumps({"timestamp": round(r.sent_s * 1000, 3), "input_length": r.num_prompt_tokens,
                                 "output_length": r.max_new_tokens,
                                 "hash_ids": [ids.setdefault(h, len(ids)) for h in hashes]}))
    return "\n".join(lines) + "\n"


def finish_run(run_dir: Path, raw: DictConfig, cfg: RunConfig, records: list[Request], requests: pd.DataFrame,
               steps: pd.DataFrame | None, summary: dict, workload_info: dict,
               interrupted: RunInterrupted | None) -> dict:
    """Write the run's files and print its table; then stop as interrupted if it was, else return the summary."""
    write_results(run_dir, raw, cfg, records, requests, steps, summary, workload_info)
    print(terminal_table(summary))
    print(f"results: {run_dir}")
    for warning in ("layout_warning", "measurement_warning"):
        if summary.get(warning):
            print(f"warning: {summary[warning]}", file=sys.stderr)
    if interrupted is not None:
        raise interrupted
    return summary
