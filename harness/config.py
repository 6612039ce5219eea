"""Checks a resolved config before any work starts: one clear error naming the key and the value."""

import torch
from omegaconf import DictConfig, OmegaConf

from harness.model import DTYPES
from kernels import BACKENDS
from strategies import STRATEGIES

POSITIVE_INTS = ("kv_cache.block_size", "kv_cache.num_blocks", "workload.num_requests", "strategy.batch_size",
                 "strategy.max_batch_tokens", "strategy.max_num_seqs", "strategy.max_prefill_chunk")
CHOICES = {
    "device": ("auto", "cpu", "cuda"),
    "dtype": ("auto", *DTYPES),
    "strategy.name": tuple(STRATEGIES),
    "runner.name": ("real",),
    "kernel_backend": BACKENDS,
}


class ConfigError(ValueError):
    pass


def validate(cfg: DictConfig) -> None:
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")
    for key in POSITIVE_INTS:
        value = OmegaConf.select(cfg, key)
        if value is None and (key == "strategy.max_prefill_chunk" or not _present(cfg, key)):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a positive integer; got {value!r}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device; use device=auto or device=cpu")


def _present(cfg: DictConfig, key: str) -> bool:
    section, name = key.rsplit(".", 1)
    return name in OmegaConf.select(cfg, section)
