"""The model: the built-in `tiny-llama` (seeded random weights, offline) or any transformers causal LM."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def build_tiny_llama(config: dict, seed: int) -> LlamaForCausalLM:
    """A Llama built from a config with seeded random weights. The config's large `initializer_range` keeps
    greedy decoding context-dependent; at the usual 0.02 it collapses onto a few tokens and hides bugs."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**config))


def load_model(model_cfg, device: torch.device, dtype: torch.dtype):
    """Returns (model in eval mode on `device`, its tokenizer or None)."""
    if model_cfg.source == "tiny":
        model, tokenizer = build_tiny_llama(dict(model_cfg.config), int(model_cfg.seed)), None
    else:
        model = AutoModelForCausalLM.from_pretrained(model_cfg.name, dtype=dtype,
                                                     trust_remote_code=bool(model_cfg.trust_remote_code))
        tokenizer = AutoTokenizer.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def load_vocabulary(model_cfg):
    """(vocab_size, tokenizer or None) without loading weights: enough to build a workload for the model."""
    if model_cfg.source == "tiny":
        return int(model_cfg.config.vocab_size), None
    remote = bool(model_cfg.trust_remote_code)
    config = AutoConfig.from_pretrained(model_cfg.name, trust_remote_code=remote)
    return config.vocab_size, AutoTokenizer.from_pretrained(model_cfg.name, trust_remote_code=remote)
