"""The model: `tiny-llama` (built from a config with seeded random weights, offline), a model only described by
its config (for simulation), or any transformers causal LM from the hub or a path."""

import logging

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from harness.layout import config_value
from harness.model_spec import dtype_name, load_tokenizer, read_model_config

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device_type: str) -> torch.dtype:
    return DTYPES[dtype_name(name, device_type)]


def has_random_weights(model_cfg) -> bool:
    """Built or described models, and `model.weights=random`: seeded random weights, not trained ones."""
    return model_cfg.source in ("tiny", "config") or getattr(model_cfg, "weights", "pretrained") == "random"


def model_config(model_cfg) -> PretrainedConfig:
    """The architecture, without weights."""
    if model_cfg.source in ("tiny", "config"):
        options = read_model_config(model_cfg)
        return AutoConfig.for_model(options.pop("model_type"), **options)
    return AutoConfig.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))


def build_random_model(config: PretrainedConfig, seed: int, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32):
    """A model with seeded random weights, built on `device` in `dtype` (an 8B model initialised on a CPU and
    then moved would take minutes). tiny-llama's large `initializer_range` keeps greedy decoding
    context-dependent; at the usual 0.02 it collapses onto a few tokens and hides bugs."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_model(model_cfg, device: torch.device, dtype: torch.dtype):
    """Weights for the real runner: (model in eval mode on `device`, its tokenizer or None). A described model,
    or `model.weights=random`, gets seeded random weights: real timings, meaningless outputs (`has_random_weights`)."""
    if model_cfg.source == "tiny":
        model = build_random_model(model_config(model_cfg), int(model_cfg.seed))
    elif has_random_weights(model_cfg):
        log.warning("model %s has random weights (model.weights=random): its timings are real, its outputs "
                    "are meaningless", model_cfg.name)
        model = build_random_model(model_config(model_cfg), int(model_cfg.seed), device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_cfg.name, dtype=dtype,
                                                     trust_remote_code=bool(model_cfg.trust_remote_code))
    return model.to(device=device, dtype=dtype).eval(), load_tokenizer(model_cfg)


def eos_token_ids(model) -> frozenset[int]:
    """Every id that ends a generation: the config's and the generation config's, each an int or a list
    (Llama-3 lists several)."""
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        value = config_value(source, "eos_token_id") if source is not None else None
        if value is not None:
            ids.update(value if isinstance(value, list | tuple) else [value])
    return frozenset(int(i) for i in ids)
