"""`workload=<name>` config → `Workload`. Every source yields lengths (and maybe text, timestamps or prefix
hashes); sampling, clamps, prompt ids and arrivals are then applied the same way, from one seeded generator."""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workloads.arrivals import arrival_times
from workloads.config import (
    ConversationWorkload,
    ParsedWorkload,
    RandomWorkload,
    ShareGPTWorkload,
    SyntheticWorkload,
    TraceWorkload,
    parse_workload,
)
from workloads.conversation import build_conversations, system_prompt
from workloads.lengths import sample_lengths
from workloads.sharegpt import load_sharegpt_pairs
from workloads.spec import (
    MAX_SPAN_S,
    RANDOM_PREFIX,
    TRACE_BLOCK,
    RequestSpec,
    Workload,
    WorkloadError,
    fits_context,
    piece_key,
)
from workloads.tokenizer import text_encoder
from workloads.traces import MOONCAKE_BLOCK_TOKENS, load_azure, load_burstgpt, load_mooncake, prefix_prompt_ids

PROFILES_DIR = Path(__file__).parent / "profiles"


@dataclass
class SourceRows:
    """What a source yields, one entry per candidate request, in file (or draw) order."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    prompt_ids: list[list[int]] | None = None  # text sources, tokenised
    timestamps_s: np.ndarray | None = None  # traces
    hash_ids: list[list[int]] | None = None  # Mooncake's prefix blocks
    info: dict = field(default_factory=dict)


def build_workload(cfg, vocab_size: int, hf_tokenizer=None, max_model_len: int | None = None,
                   with_ids: bool = True) -> Workload:
    """Build the workload a config describes (a parsed config, or a mapping that is parsed first), for a model
    with `vocab_size` ids, its tokenizer if any, and its context `max_model_len`: a request longer than the
    context keeps its lengths for the record but gets no prompt ids (the engine rejects it with the reason).
    `with_ids` False: lengths only, for a simulator (a million prompts' ids would fill the memory); the requests'
    lengths and arrivals are the same either way."""
    if not isinstance(cfg, ParsedWorkload):
        cfg = parse_workload(cfg)
    if isinstance(cfg, ConversationWorkload):
        return build_conversations(cfg, vocab_size, max_model_len, with_ids, hf_tokenizer)
    n = cfg.num_requests
    rng = np.random.default_rng(cfg.seed)
    rows = _read_source(cfg, n, rng, vocab_size, hf_tokenizer)
    chosen = _choose(len(rows.prompt_lens), n, getattr(cfg, "sample", "first"), rng)
    info = dict(rows.info)
    if len(chosen) < n:
        info["note"] = f"asked for {n} requests, the source has {len(chosen)}"

    prompt_lens = rows.prompt_lens[chosen]
    output_lens = rows.output_lens[chosen]
    if cfg.max_prompt_len:
        prompt_lens = np.minimum(prompt_lens, cfg.max_prompt_len)
    if cfg.max_output_len:
        output_lens = np.minimum(output_lens, cfg.max_output_len)
    system = system_prompt(cfg, vocab_size)
    pieces = [system.pieces + _truncated(p, length) for p, length in zip(_pieces(cfg, rows, chosen), prompt_lens)]
    servable = fits_context(prompt_lens + len(system), output_lens, max_model_len or np.iinfo(np.int64).max)
    if not servable.all():
        info["beyond_context"] = f"{int((~servable).sum())} requests longer than the model's context"
    arrivals = _arrivals(cfg, rows, chosen, rng)
    if with_ids:
        # Their own stream, so drawing them or not leaves the arrivals alone.
        ids_rng = np.random.default_rng([cfg.seed, 1])
        prompts = [system.ids + ids if ids else ()
                   for ids in _prompt_ids(cfg, rows, chosen, prompt_lens, servable, vocab_size, ids_rng)]
    else:
        prompts = [()] * len(chosen)
    requests = [
        RequestSpec(request_id=k, arrival_s=t, prompt_ids=ids, max_new_tokens=m, prompt_len=p, prefix_pieces=pp)
        for k, (t, ids, m, p, pp) in enumerate(zip(arrivals.tolist(), prompts, output_lens.tolist(),
                                                   (prompt_lens + len(system)).tolist(), pieces))
    ]
    return Workload(name=cfg.name, requests=requests, info=info)


def _pieces(cfg, rows: SourceRows, chosen: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    """The shared pieces each chosen request's source prompt starts with: a random prefix, a trace's blocks."""
    if isinstance(cfg, RandomWorkload) and cfg.prefix_len:
        return [((piece_key(RANDOM_PREFIX, cfg.seed), cfg.prefix_len),)] * len(chosen)
    if rows.hash_ids is not None:
        return [tuple((piece_key(TRACE_BLOCK, h), MOONCAKE_BLOCK_TOKENS) for h in rows.hash_ids[i]) for i in chosen]
    return [()] * len(chosen)


def _truncated(pieces: tuple[tuple[int, int], ...], length: int) -> tuple[tuple[int, int], ...]:
    """`pieces` cut to a prompt of `length` tokens (a clamped prompt, a trace's last block partly used)."""
    kept, start = [], 0
    for key, size in pieces:
        if start >= length:
            break
        kept.append((key, min(size, length - start)))
        start += size
    return tuple(kept)


def _prompt_ids(cfg, rows: SourceRows, chosen: np.ndarray, prompt_lens: np.ndarray, servable: np.ndarray,
                vocab_size: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    prompts = []
    for i, length, fits in zip(chosen, prompt_lens.tolist(), servable.tolist()):
        if not fits:
            prompts.append(())
        elif rows.prompt_ids is not None:
            prompts.append(tuple(int(x) for x in rows.prompt_ids[i][:length]))
        elif rows.hash_ids is not None:
            ids = prefix_prompt_ids(rows.hash_ids[i], length, vocab_size, cfg.seed, rng)
            prompts.append(tuple(int(x) for x in ids))
        else:  # length-only sources: batching cares about lengths, not words
            prompts.append(tuple(rng.integers(0, vocab_size, size=length).tolist()))
    return prompts


def _read_source(cfg, n: int, rng: np.random.Generator, vocab_size: int, hf_tokenizer) -> SourceRows:
    if isinstance(cfg, TraceWorkload):
        if cfg.source == "azure":  # the first n requests are its first n rows: the rest is not read
            first_rows = cfg.sample == "first" and cfg.start_s == 0
            trace = load_azure(cfg.path, cfg.timestamp_unit, n if first_rows else None)
        elif cfg.source == "burstgpt":  # rows it drops (a model filter, failed requests) make n rows too few
            trace = load_burstgpt(cfg.path, cfg.model)
        else:
            trace = load_mooncake(cfg.path)
        return _in_window(SourceRows(trace.prompt_lens, trace.output_lens, timestamps_s=trace.timestamps_s,
                                     hash_ids=trace.hash_ids,
                                     info={"source": f"{cfg.source} trace {cfg.path}", **trace.info}), cfg)
    if isinstance(cfg, ShareGPTWorkload) and cfg.path:
        encode, tokenizer_name = text_encoder(vocab_size, hf_tokenizer)
        keep = cfg.filter
        pairs, info = load_sharegpt_pairs(cfg.path, encode, rng, n, keep.min_len, keep.max_prompt_len,
                                          keep.max_total_len)
        return SourceRows(np.array([len(ids) for ids, _ in pairs]), np.array([m for _, m in pairs]),
                          prompt_ids=[ids for ids, _ in pairs],
                          info={"source": f"ShareGPT file {cfg.path}", "tokenizer": tokenizer_name, **info})
    if isinstance(cfg, RandomWorkload):
        return _random_rows(cfg, n, rng, vocab_size)
    if isinstance(cfg, SyntheticWorkload):
        prompt_spec, output_spec, info = cfg.prompt, cfg.output, {"source": "synthetic"}
        max_total = None
    else:
        # ShareGPT without a file: the embedded length profile, labelled as such everywhere it shows.
        profile = json.loads((PROFILES_DIR / "sharegpt.json").read_text())
        keep = cfg.filter
        prompt_spec = parse_length(profile["prompt"] | {"min": keep.min_len, "max": keep.max_prompt_len})
        output_spec = parse_length(profile["output"] | {"min": keep.min_len, "max": keep.max_total_len})
        info = {"source": "ShareGPT length profile (not the real data set)", "provenance": profile["provenance"]}
        max_total = keep.max_total_len
    prompt_lens = sample_lengths(prompt_spec, n, rng)
    output_lens = sample_lengths(output_spec, n, rng)
    if max_total:
        output_lens = np.minimum(output_lens, max_total - prompt_lens)
    return SourceRows(prompt_lens, output_lens, info=info)


def _in_window(rows: SourceRows, cfg: TraceWorkload) -> SourceRows:
    """The trace's requests from `start_s` for `duration_s` (seconds from its first request)."""
    if cfg.start_s == 0 and cfg.duration_s is None:
        return rows
    end = cfg.start_s + cfg.duration_s if cfg.duration_s is not None else np.inf
    keep = np.flatnonzero((rows.timestamps_s >= cfg.start_s) & (rows.timestamps_s < end))
    if not len(keep):
        raise WorkloadError(f"trace file {cfg.path!r} has no request between {cfg.start_s:g} s and {end:g} s from its "
                            f"first (it spans {rows.timestamps_s[-1]:g} s)")
    return SourceRows(rows.prompt_lens[keep], rows.output_lens[keep], timestamps_s=rows.timestamps_s[keep],
                      hash_ids=[rows.hash_ids[i] for i in keep] if rows.hash_ids is not None else None,
                      info=rows.info | {"window_s": [cfg.start_s, end]})


def _random_rows(cfg: RandomWorkload, n: int, rng: np.random.Generator, vocab_size: int) -> SourceRows:
    """vLLM's random dataset: uniform integer lengths around the means, after a prefix every request shares."""

    def uniform(mean: int, floor: int) -> np.ndarray:
        low = max(math.floor(mean * (1 - cfg.range_ratio)), floor)
        high = max(math.ceil(mean * (1 + cfg.range_ratio)), floor)
        return rng.integers(low, high + 1, size=n)

    input_lens, output_lens = uniform(cfg.input_len, 0), uniform(cfg.output_len, 1)
    prefix = rng.integers(0, vocab_size, size=cfg.prefix_len).tolist()
    prompts = [prefix + rng.integers(0, vocab_size, size=int(k)).tolist() for k in input_lens]
    info = {"source": f"random (as vllm bench --dataset-name random: input {cfg.input_len}, output "
                      f"{cfg.output_len}, range ratio {cfg.range_ratio:g}, prefix {cfg.prefix_len})"}
    return SourceRows(input_lens + cfg.prefix_len, output_lens, prompt_ids=prompts, info=info)


def parse_length(spec: dict):
    """A length distribution from the embedded profile, checked like one from a config."""
    return SyntheticWorkload.model_validate(
        {"name": "profile", "source": "synthetic", "num_requests": 1, "seed": 0, "prompt": spec, "output": spec}
    ).prompt


def _choose(available: int, n: int, how: str, rng: np.random.Generator) -> np.ndarray:
    """Indices of the requests to keep, in source order: the first n, or a seeded sample of n."""
    if how == "first" or available <= n:
        return np.arange(min(n, available))
    return np.sort(rng.choice(available, size=n, replace=False))


def _arrivals(cfg, rows: SourceRows, chosen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if cfg.arrival != "trace":
        return _within_the_clock(arrival_times(cfg.arrival, len(chosen), rng, cfg.rate, cfg.burstiness), "rate",
                                 cfg.rate or 0.0)
    if rows.timestamps_s is None:
        raise WorkloadError(f"workload.arrival=trace needs a source with timestamps; {cfg.source} has none")
    stamps = rows.timestamps_s[chosen]
    return _within_the_clock((stamps - stamps[0]) * cfg.time_scale, "time_scale", cfg.time_scale)


def _within_the_clock(arrivals: np.ndarray, key: str, value: float) -> np.ndarray:
    """The config's check covers the mean span; a draw (a gamma of small burstiness) or a scaled trace may still
    spread further than a run's clock resolves."""
    if len(arrivals) and arrivals[-1] > MAX_SPAN_S:
        raise WorkloadError(f"workload.{key}={value:g} spreads the requests over {arrivals[-1]:.3g} s, more than ten "
                            "years: a run's clock would round its step times away")
    return arrivals
