"""`workload=<name>` config → `Workload`. Every source yields lengths (and maybe text, timestamps or prefix
hashes); sampling, clamps, prompt ids and arrivals are then applied the same way, from one seeded generator."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workloads.arrivals import arrival_times
from workloads.lengths import sample_lengths
from workloads.sharegpt import load_sharegpt_pairs
from workloads.spec import RequestSpec, Workload, WorkloadError
from workloads.tokenizer import text_encoder
from workloads.traces import load_azure, load_burstgpt, load_mooncake, prefix_prompt_ids

PROFILES_DIR = Path(__file__).parent / "profiles"
TRACES = {"azure": load_azure, "burstgpt": load_burstgpt, "mooncake": load_mooncake}
SOURCES = ("synthetic", "sharegpt", *TRACES)


@dataclass
class SourceRows:
    """What a source yields, one entry per candidate request, in file (or draw) order."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    prompt_ids: list[list[int]] | None = None  # text sources, tokenised
    timestamps_s: np.ndarray | None = None  # traces
    hash_ids: list[list[int]] | None = None  # Mooncake's prefix blocks
    info: dict = field(default_factory=dict)


def build_workload(cfg, vocab_size: int, hf_tokenizer=None) -> Workload:
    """Build the workload a config describes, for a model with `vocab_size` ids (and its tokenizer, if any)."""
    if cfg.source not in SOURCES:
        raise WorkloadError(f"unknown workload.source {cfg.source!r}; choose one of {', '.join(SOURCES)}")
    n = cfg.num_requests
    rng = np.random.default_rng(int(cfg.seed))
    rows = _read_source(cfg, n, rng, vocab_size, hf_tokenizer)
    chosen = _choose(len(rows.prompt_lens), n, cfg.get("sample", "first"), rng)
    info = dict(rows.info)
    if len(chosen) < n:
        info["note"] = f"asked for {n} requests, the source has {len(chosen)}"

    prompt_lens = rows.prompt_lens[chosen]
    output_lens = rows.output_lens[chosen]
    if cfg.get("max_prompt_len"):
        prompt_lens = np.minimum(prompt_lens, int(cfg.max_prompt_len))
    if cfg.get("max_output_len"):
        output_lens = np.minimum(output_lens, int(cfg.max_output_len))
    prompts = []
    for i, length in zip(chosen, prompt_lens):
        if rows.prompt_ids is not None:
            prompts.append(rows.prompt_ids[i][:length])
        elif rows.hash_ids is not None:
            prompts.append(prefix_prompt_ids(rows.hash_ids[i], int(length), vocab_size, int(cfg.seed), rng))
        else:  # length-only sources: batching cares about lengths, not words
            prompts.append(rng.integers(0, vocab_size, size=int(length)).tolist())
    arrivals = _arrivals(cfg, rows, chosen, rng)
    requests = [
        RequestSpec(request_id=k, arrival_s=float(t), prompt_ids=tuple(int(x) for x in ids), max_new_tokens=int(m))
        for k, (t, ids, m) in enumerate(zip(arrivals, prompts, output_lens))
    ]
    return Workload(name=cfg.name, requests=requests, info=info)


def _read_source(cfg, n: int, rng: np.random.Generator, vocab_size: int, hf_tokenizer) -> SourceRows:
    if cfg.source in TRACES:
        if not cfg.get("path"):
            raise WorkloadError(f"workload={cfg.name} needs workload.path=<trace file>")
        options = {"model": cfg.get("model")} if cfg.source == "burstgpt" else {}
        trace = TRACES[cfg.source](cfg.path, **options)
        return SourceRows(trace.prompt_lens, trace.output_lens, timestamps_s=trace.timestamps_s,
                          hash_ids=trace.hash_ids, info={"source": f"{cfg.source} trace {cfg.path}", **trace.info})
    if cfg.source == "sharegpt" and cfg.get("path"):
        encode, tokenizer_name = text_encoder(vocab_size, hf_tokenizer)
        keep = cfg.filter
        pairs, info = load_sharegpt_pairs(cfg.path, encode, rng, n, int(keep.min_len), int(keep.max_prompt_len),
                                          int(keep.max_total_len))
        return SourceRows(np.array([len(ids) for ids, _ in pairs]), np.array([m for _, m in pairs]),
                          prompt_ids=[ids for ids, _ in pairs],
                          info={"source": f"ShareGPT file {cfg.path}", "tokenizer": tokenizer_name, **info})
    if cfg.source == "synthetic":
        prompt_spec, output_spec, info = dict(cfg.prompt), dict(cfg.output), {"source": "synthetic"}
        max_total = None
    else:
        # ShareGPT without a file: the embedded length profile, labelled as such everywhere it shows.
        profile = json.loads((PROFILES_DIR / "sharegpt.json").read_text())
        keep = cfg.filter
        prompt_spec = profile["prompt"] | {"min": int(keep.min_len), "max": int(keep.max_prompt_len)}
        output_spec = profile["output"] | {"min": int(keep.min_len), "max": int(keep.max_total_len)}
        info = {"source": "ShareGPT length profile (not the real data set)", "provenance": profile["provenance"]}
        max_total = int(keep.max_total_len)
    prompt_lens = sample_lengths(prompt_spec, n, rng, "workload.prompt")
    output_lens = sample_lengths(output_spec, n, rng, "workload.output")
    if max_total:
        output_lens = np.minimum(output_lens, max_total - prompt_lens)
    return SourceRows(prompt_lens, output_lens, info=info)


def _choose(available: int, n: int, how: str, rng: np.random.Generator) -> np.ndarray:
    """Indices of the requests to keep, in source order: the first n, or a seeded sample of n."""
    if how == "first" or available <= n:
        return np.arange(min(n, available))
    if how == "random":
        return np.sort(rng.choice(available, size=n, replace=False))
    raise WorkloadError(f"workload.sample must be first or random, got {how!r}")


def _arrivals(cfg, rows: SourceRows, chosen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    kind = cfg.get("arrival", "offline")
    if kind != "trace":
        return arrival_times(kind, len(chosen), rng, cfg.get("rate"), float(cfg.get("burstiness", 1.0)))
    if rows.timestamps_s is None:
        raise WorkloadError(f"workload.arrival=trace needs a source with timestamps; {cfg.source} has none")
    scale = float(cfg.get("time_scale", 1.0))
    if not scale > 0:
        raise WorkloadError(f"workload.time_scale must be > 0, got {scale}")
    stamps = rows.timestamps_s[chosen]
    return (stamps - stamps[0]) * scale
