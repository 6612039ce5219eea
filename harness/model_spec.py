"""A model without its weights: its config, its shape (`Architecture`: what the KV cache, the roofline and the
real runner's cache tensors need) and its tokenizer.

Read from a transformers config — a `config.json` mapping or a `PretrainedConfig` — without importing the model
code, so a simulated run never pays for it.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MODEL_SOURCES = ("tiny", "config", "hf")  # built here with random weights, described only, or loaded


def config_value(config, key: str, default=None):
    """`key` of a config given as a mapping (config.json) or as an object (a transformers config)."""
    if isinstance(config, dict):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


@dataclass(frozen=True)
class Architecture:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    bytes_per_param: int

    @classmethod
    def from_config(cls, config, bytes_per_param: int) -> "Architecture":
        num_heads = config_value(config, "num_attention_heads")
        hidden = config_value(config, "hidden_size")
        return cls(
            num_layers=config_value(config, "num_hidden_layers"), hidden_size=hidden,
            intermediate_size=config_value(config, "intermediate_size"), num_heads=num_heads,
            num_kv_heads=config_value(config, "num_key_value_heads", num_heads),
            # Most configs name head_dim only when it differs from hidden_size / heads.
            head_dim=config_value(config, "head_dim", hidden // num_heads),
            vocab_size=config_value(config, "vocab_size"), bytes_per_param=bytes_per_param,
        )

    @property
    def layer_params(self) -> int:
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size  # gated MLP: gate, up, down

    @property
    def weight_bytes(self) -> int:
        embeddings = 2 * self.vocab_size * self.hidden_size  # input embedding and LM head
        return (self.num_layers * self.layer_params + embeddings) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


def dtype_name(name: str, device_type: str) -> str:
    """The dtype a run computes in: `auto` is bfloat16 on an accelerator and float32 on a CPU."""
    if name == "auto":
        return "bfloat16" if device_type != "cpu" else "float32"
    return name


def read_model_config(model_cfg) -> dict:
    """The model's config as a mapping, without loading weights or model code: the `config` a described or
    built-in model carries in `conf/model/`, or the `config.json` of a local folder or (cached) hub model."""
    if model_cfg.source in ("tiny", "config"):
        return OmegaConf.to_container(model_cfg.config, resolve=True)
    folder = Path(model_cfg.name)
    if folder.is_dir():
        path = folder / "config.json"
    else:
        from huggingface_hub import hf_hub_download  # a hub id: its config.json, from the cache when offline

        path = Path(hf_hub_download(model_cfg.name, "config.json"))
    return json.loads(path.read_text())


def load_tokenizer(model_cfg):
    """The model's own tokenizer for `model=hf`; None for models built or described from a config."""
    if model_cfg.source != "hf":
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))
