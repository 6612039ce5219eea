"""`workload=<name>` config → `Workload`: lengths and arrivals drawn from one seeded generator."""

import json
from pathlib import Path

import numpy as np

from workloads.arrivals import arrival_times
from workloads.lengths import sample_lengths
from workloads.sharegpt import load_sharegpt_pairs
from workloads.spec import RequestSpec, Workload, WorkloadError
from workloads.tokenizer import text_encoder

PROFILES_DIR = Path(__file__).parent / "profiles"
SOURCES = ("synthetic", "sharegpt")


def build_workload(cfg, vocab_size: int, hf_tokenizer=None) -> Workload:
    """Build the workload a config describes, for a model with `vocab_size` ids (and its tokenizer, if any)."""
    if cfg.source not in SOURCES:
        raise WorkloadError(f"unknown workload.source {cfg.source!r}; choose one of {', '.join(SOURCES)}")
    if not int(cfg.num_requests) >= 1:
        raise WorkloadError(f"workload.num_requests must be >= 1, got {cfg.num_requests}")
    rng = np.random.default_rng(int(cfg.seed))
    n = int(cfg.num_requests)
    if cfg.source == "sharegpt" and cfg.path:
        encode, tokenizer_name = text_encoder(vocab_size, hf_tokenizer)
        pairs, info = load_sharegpt_pairs(cfg.path, encode, rng, n, int(cfg.min_len), int(cfg.max_prompt_len),
                                          int(cfg.max_total_len))
        prompts = [ids for ids, _ in pairs]
        output_lens = np.array([length for _, length in pairs])
        info |= {"source": f"ShareGPT file {cfg.path}", "tokenizer": tokenizer_name}
    else:
        prompt_spec, output_spec, info = _length_specs(cfg)
        prompt_lens = sample_lengths(prompt_spec, n, rng, "workload.prompt")
        output_lens = sample_lengths(output_spec, n, rng, "workload.output")
        if cfg.get("max_total_len"):
            output_lens = np.minimum(output_lens, int(cfg.max_total_len) - prompt_lens)
        # Length-only sources get deterministic random prompt ids: batching cares about lengths, not words.
        prompts = [rng.integers(0, vocab_size, size=int(length)).tolist() for length in prompt_lens]
    if cfg.get("max_output_len"):
        output_lens = np.minimum(output_lens, int(cfg.max_output_len))
    arrivals = arrival_times(cfg.arrival, len(prompts), rng, cfg.get("rate"), float(cfg.get("burstiness", 1.0)))
    requests = [
        RequestSpec(request_id=i, arrival_s=float(t), prompt_ids=tuple(int(x) for x in ids), max_new_tokens=int(m))
        for i, (t, ids, m) in enumerate(zip(arrivals, prompts, output_lens))
    ]
    if len(requests) < n:
        info["note"] = f"asked for {n} requests, the source yielded {len(requests)}"
    return Workload(name=cfg.name, requests=requests, info=info)


def _length_specs(cfg) -> tuple[dict, dict, dict]:
    if cfg.source == "synthetic":
        return dict(cfg.prompt), dict(cfg.output), {"source": "synthetic"}
    # ShareGPT without a file: the embedded length profile, labelled as such everywhere it shows.
    profile = json.loads((PROFILES_DIR / "sharegpt.json").read_text())
    prompt = profile["prompt"] | {"min": int(cfg.min_len), "max": int(cfg.max_prompt_len)}
    output = profile["output"] | {"min": int(cfg.min_len), "max": int(cfg.max_total_len)}
    return prompt, output, {"source": "ShareGPT length profile (not the real data set)",
                            "provenance": profile["provenance"]}
