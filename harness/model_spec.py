"""A model without its weights: its config, its shape (`Architecture`: what the KV cache, the roofline and the
real runner's cache tensors need) and its tokenizer.

Read from a transformers config — a `config.json` mapping or a `PretrainedConfig` — without importing the model
code, so a simulated run never pays for it.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from workloads.config import plain_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MODEL_SOURCES = ("tiny", "config", "hf")  # built here with random weights, described only, or loaded
MODEL_CATALOGUE = Path(__file__).resolve().parents[1] / "conf" / "model"


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
    tie_word_embeddings: bool = False  # one table serves as input embedding and LM head
    # A mixture of experts (Mixtral's `num_local_experts`, Qwen's `num_experts`): each layer's MLP is one of
    # `num_experts` gated MLPs of `intermediate_size` (Qwen's `moe_intermediate_size`), `experts_per_token` of
    # them per token, chosen by a router. 0: a dense MLP.
    num_experts: int = 0
    experts_per_token: int = 0

    @classmethod
    def from_config(cls, config, bytes_per_param: int) -> "Architecture":
        num_heads = config_value(config, "num_attention_heads")
        hidden = config_value(config, "hidden_size")
        # A Qwen-style MoE gives its experts their own size; Mixtral's experts are `intermediate_size` wide.
        expert_size = config_value(config, "moe_intermediate_size", None)
        return cls(
            num_layers=config_value(config, "num_hidden_layers"), hidden_size=hidden,
            intermediate_size=expert_size or config_value(config, "intermediate_size"), num_heads=num_heads,
            num_kv_heads=config_value(config, "num_key_value_heads", num_heads),
            # Most configs name head_dim only when it differs from hidden_size / heads.
            head_dim=config_value(config, "head_dim", hidden // num_heads),
            vocab_size=config_value(config, "vocab_size"), bytes_per_param=bytes_per_param,
            tie_word_embeddings=bool(config_value(config, "tie_word_embeddings", False)),
            num_experts=config_value(config, "num_local_experts", config_value(config, "num_experts", 0)) or 0,
            experts_per_token=config_value(config, "num_experts_per_tok", 0) or 0,
        )

    @property
    def attention_params(self) -> int:
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size

    @property
    def mlp_params(self) -> int:
        """One gated MLP (gate, up, down): the layer's, or one expert's."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def layer_params(self) -> int:
        """Every weight of a layer, each expert included: what memory holds."""
        return self.attention_params + self.mlp_params * max(self.num_experts, 1) + self.router_params

    @property
    def active_layer_params(self) -> int:
        """The weights one token multiplies in a layer: its `experts_per_token` experts, not all of them."""
        experts = self.experts_per_token if self.num_experts else 1
        return self.attention_params + self.mlp_params * experts + self.router_params

    def experts_touched(self, num_tokens: int) -> float:
        """Distinct experts a layer reads for `num_tokens` tokens, each routed to `experts_per_token` of
        `num_experts` (uniform routing, the load-balancing loss's aim): E (1 - (1 - k/E)^T). 1 for a dense MLP."""
        if not self.num_experts:
            return 1.0
        return self.num_experts * (1 - (1 - self.experts_per_token / self.num_experts) ** num_tokens)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """The weights' memory: the layers, the input embedding and (unless tied) the LM head."""
        embeddings = (1 if self.tie_word_embeddings else 2) * self.embedding_params
        return (self.num_layers * self.layer_params + embeddings) * self.bytes_per_param

    def weight_bytes_read(self, num_tokens: int) -> float:
        """What a forward pass over `num_tokens` tokens streams from memory: every layer (of a MoE, the experts its
        tokens touch) and the LM head. The input embedding is looked up, a few rows per token, never read whole."""
        layer = self.attention_params + self.mlp_params * self.experts_touched(num_tokens) + self.router_params
        return (self.num_layers * layer + self.embedding_params) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


def dtype_name(name: str, device_type: str) -> str:
    """The dtype a run computes in: `auto` is bfloat16 on an accelerator and float32 on a CPU."""
    if name == "auto":
        return "bfloat16" if device_type != "cpu" else "float32"
    return name


def read_model_config(model_cfg) -> dict:
    """The model's config as a mapping, without loading weights or model code: the `config` a built-in or
    described model carries in `conf/model/`, or the `config.json` of a local folder or a hub model (from the
    cache, or downloaded when the hub can be reached). Raises OSError saying which of those failed."""
    if model_cfg.source in ("tiny", "config"):
        config = model_cfg.config
        return config.model_dump(exclude_unset=True) if hasattr(config, "model_dump") else plain_config(config)
    name = model_cfg.name
    folder = Path(name).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        if not path.is_file():
            raise OSError(f"the folder {str(folder)!r} has no config.json (not a transformers model folder)")
    elif name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise OSError(f"no folder {name!r}")
    else:
        path = Path(_hub_file(name, "config.json"))
    return json.loads(path.read_text())


def _hub_file(repo_id: str, filename: str) -> str:
    """A hub file from the local cache, else downloaded; a clear OSError when neither can work."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return cached
    if constants.HF_HUB_OFFLINE:
        raise OSError(f"{repo_id!r} is not a local folder and not in the Hugging Face cache (HF_HUB_OFFLINE is set)")
    host = urlparse(constants.ENDPOINT).hostname
    try:  # one short probe: the hub client would otherwise retry for half a minute before saying so
        socket.create_connection((host, 443), timeout=float(os.environ.get("BATCHLAB_HUB_TIMEOUT_S", 3))).close()
    except OSError:
        raise OSError(f"{repo_id!r} is not a local folder, not in the Hugging Face cache, and {host} cannot be "
                      "reached to download it") from None
    return hf_hub_download(repo_id, filename)


def load_tokenizer(model_cfg):
    """The model's own tokenizer for `model=hf`; None for models built or described from a config."""
    if model_cfg.source != "hf":
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_cfg.name, trust_remote_code=bool(model_cfg.trust_remote_code))


def described_model(name: str) -> dict:
    """A model's config mapping from what describes it: a folder holding its `config.json` (a `model=hf` run's
    `model.name`), or a catalogue entry with a `config` (`conf/model/<name>.yaml`)."""
    from omegaconf import OmegaConf

    folder = Path(name)
    if (folder / "config.json").is_file():
        try:
            return json.loads((folder / "config.json").read_text())
        except ValueError as e:
            raise ValueError(f"model {name!r}: its config.json is not JSON: {e}") from None
    entry = MODEL_CATALOGUE / f"{name}.yaml"
    if "/" not in name and entry.is_file() and "config" in (described := OmegaConf.load(entry)):
        return OmegaConf.to_container(described.config, resolve=True)
    catalogue = sorted(p.stem for p in MODEL_CATALOGUE.glob("*.yaml") if "config" in OmegaConf.load(p))
    raise ValueError(f"unknown model {name!r}: give a model of the catalogue (conf/model/: {', '.join(catalogue)}) "
                     "or a folder holding the model's config.json")
