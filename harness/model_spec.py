"""A model without its weights: its config and its tokenizer (its shape is `harness.architecture.Architecture`).

Read from a transformers config — a `config.json` mapping or a `PretrainedConfig` — without importing the model
code, so a simulated run never pays for it.
"""

import json
from pathlib import Path

from workloads.config import plain_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MODEL_SOURCES = ("tiny", "config", "hf")  # built here with random weights, described only, or loaded
MODEL_CATALOGUE = Path(__file__).resolve().parents[1] / "conf" / "model"


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
    return language_model_config(json.loads(path.read_text()))


def language_model_config(config: dict) -> dict:
    """The config of the model that generates the text, as its transformers config class reads the file: a
    `config.json` names only what differs from the class's defaults (Gemma 3's leaves out its vocabulary, its context
    and which layers slide), and a checkpoint that also reads images (Qwen3.5, Gemma 3, Llama 4, Mistral 3) nests its
    language model in `text_config`, beside its vision encoder, keeping what applies to both at the top (its
    `quantization_config`). A simulation times the language model alone. A model type this transformers does not
    know, or whose values its class rejects (Nemotron-H's own saved defaults include an infinity it will not read
    back), is read as its file gives it."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    quantization = {"quantization_config": config["quantization_config"]} if "quantization_config" in config else {}
    try:
        return quantization | AutoConfig.for_model(**config).get_text_config().to_dict()
    except (ValueError, KeyError, TypeError, StrictDataclassError):  # no model_type, one it lacks, or rejected values
        pass
    text = config.get("text_config")
    if not isinstance(text, dict) or "num_hidden_layers" in config:
        return config
    outer = {key: value for key, value in config.items() if key not in ("text_config", "vision_config")}
    return outer | text


def transformers_num_params(config: dict) -> int | None:
    """The parameters transformers' own model class holds for this language model config, built on the meta device
    (no memory, no weights, a second or two for the largest): what `Architecture.num_params` is checked against for
    a model brought from outside the catalogue. Built unquantized (a checkpoint's quantization would swap its layers
    for the format's). None where transformers cannot build it: a model type it does not know, or any failure of its
    construction, which only means there is nothing to check against."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        plain = {key: value for key, value in config.items() if key != "quantization_config"}
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**plain))
    except Exception:  # a third party's constructor: whatever it raises, there is no count to compare with
        return None
    return sum(parameter.numel() for parameter in model.parameters())


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
            return language_model_config(json.loads((folder / "config.json").read_text()))
        except ValueError as e:
            raise ValueError(f"model {name!r}: its config.json is not JSON: {e}") from None
    entry = MODEL_CATALOGUE / f"{name}.yaml"
    if "/" not in name and entry.is_file() and "config" in (described := OmegaConf.load(entry)):
        return OmegaConf.to_container(described.config, resolve=True)
    catalogue = sorted(p.stem for p in MODEL_CATALOGUE.glob("*.yaml") if "config" in OmegaConf.load(p))
    raise ValueError(f"unknown model {name!r}: give a model of the catalogue (conf/model/: {', '.join(catalogue)}) "
                     "or a folder holding the model's config.json")
