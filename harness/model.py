"""The model: `tiny-llama` (built from a config with seeded random weights, offline), a model only described by
its config (for simulation), or any transformers causal LM from the hub or a path."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SOURCES = ("tiny", "config", "hf")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device_type: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" else torch.float32
    return DTYPES[name]


def model_config(model_cfg) -> PretrainedConfig:
    """The architecture, without weights."""
    if model_cfg.source in ("tiny", "config"):
        options = dict(model_cfg.config)
        return AutoConfig.for_model(options.pop("model_type"), **options)
    return AutoConfig.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))


def load_tokenizer(model_cfg):
    """The model's tokenizer; None for models built or described from a config."""
    if model_cfg.source != "hf":
        return None
    return AutoTokenizer.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))


def build_random_model(config: PretrainedConfig, seed: int):
    """A model with seeded random weights. tiny-llama's large `initializer_range` keeps greedy decoding
    context-dependent; at the usual 0.02 it collapses onto a few tokens and hides bugs."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def load_model(model_cfg, device: torch.device, dtype: torch.dtype):
    """Weights for the real runner: (model in eval mode on `device`, its tokenizer or None)."""
    if model_cfg.source == "config":
        raise ValueError(f"model={model_cfg.name} is only described by its config, with no weights: use "
                         "runner=sim, or model=hf model.name=<hub id or path> to run a real model")
    if model_cfg.source == "tiny":
        model = build_random_model(model_config(model_cfg), int(model_cfg.seed))
    else:
        model = AutoModelForCausalLM.from_pretrained(model_cfg.name, dtype=dtype,
                                                     trust_remote_code=bool(model_cfg.trust_remote_code))
    return model.to(device=device, dtype=dtype).eval(), load_tokenizer(model_cfg)
