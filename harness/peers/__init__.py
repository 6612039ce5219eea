"""Peers: other systems run on the same workloads, through the same client, into the same tables as ours.

`hf_generate` (transformers `generate()` on left-padded batches) and `hf_continuous` (transformers' continuous
batching manager) run in this process on the run's model; `openai_server` streams the workload to any
OpenAI-compatible server. `live` is the wall-clock replay the last two need; `job` assembles a peer's run.
"""
