"""Checks a resolved config before any work starts: one clear error naming the key and the value."""

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from harness.model_spec import DTYPE_BYTES, MODEL_SOURCES
from harness.sim.router import ROUTERS
from kernels import BACKENDS
from strategies import STRATEGIES

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
POSITIVE_INTS = ("kv_cache.block_size", "workload.num_requests", "strategy.batch_size",
                 "strategy.max_batch_tokens", "strategy.max_num_seqs", "strategy.max_prefill_chunk",
                 "runner.replicas")
CHOICES = {
    "device": ("auto", "cpu", "cuda"),
    "dtype": ("auto", *DTYPE_BYTES),
    "strategy.name": tuple(STRATEGIES),
    "runner.name": ("real", "sim"),
    "runner.router": tuple(ROUTERS),
    "model.source": MODEL_SOURCES,
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
        if not _is_positive_int(value):
            raise ConfigError(f"{key} must be a positive integer; got {value!r}")
    blocks = cfg.kv_cache.num_blocks
    if blocks != "auto" and not _is_positive_int(blocks):
        raise ConfigError(f"kv_cache.num_blocks must be auto or a positive integer; got {blocks!r}")
    if cfg.runner.name == "real" and cfg.runner.replicas != 1:
        raise ConfigError("runner.replicas > 1 needs runner=sim: a real run drives one model")
    if cfg.runner.name == "sim" and cfg.stop_at_eos:
        raise ConfigError("stop_at_eos needs runner=real: a simulation computes no tokens, so sees no EOS")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device; use device=auto or device=cpu")


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _present(cfg: DictConfig, key: str) -> bool:
    section, name = key.rsplit(".", 1)
    return name in OmegaConf.select(cfg, section)


def compose_config(overrides: list[str]) -> DictConfig:
    """The same config `python -m harness` would build from these overrides, for the other entry points."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)
