"""The harness: engine, KV cache bookkeeping, runners, metrics and reports. `python -m harness` runs one job."""
