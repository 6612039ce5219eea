"""The run config's schema: every key's type and range and the rules between keys, checked before any work starts.

`validate` turns the composed Hydra config into a typed `RunConfig` or raises one `ConfigError` line naming the key
and the problem. The workload's part of the schema lives with the workloads (`workloads.config`), each strategy's
choices with the strategy; this module adds the run's own keys and the rules that span several of them.
"""

import hashlib
import os
from pathlib import Path
from typing import Annotated, Literal

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.core.kv_cache import EVICTION_ORDERS
from harness.layout import COMPRESSED_KINDS, KV_DTYPES, QUANTIZATIONS, num_linear_layers
from harness.model_spec import DTYPE_BYTES, read_model_config
from harness.sim.engine_profile import DEFAULT_ENGINE, get_engine
from strategies.continuous import ADMISSIONS, ORDERS
from workloads.config import Count, Number, Positive, Seed, Strict, WorkloadConfig, one_line, plain_config

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
KERNEL_BACKENDS = ("auto", "triton", "torch")  # ragged_kernels.BACKENDS; a test holds the two equal
ROUTER_NAMES = ("round_robin", "least_outstanding", "prefix_aware")  # harness.sim.router.ROUTERS; likewise
ENDPOINTS = ("completions", "chat")  # the OpenAI APIs a client calls: /v1/completions, /v1/chat/completions
Fraction = Annotated[Number, Field(gt=0, le=1)]
# `kv_cache.memory_fraction=auto` on a GPU but for SGLang's profile: vLLM's --gpu-memory-utilization default.
DEFAULT_MEMORY_FRACTION = 0.9
# The engine's caps (max_num_seqs, max_batch_tokens) for `auto` on a CPU: they suit the tiny model; a GPU gets vLLM's.
CPU_ENGINE_CAPS = (16, 512)
VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c", "--package",
               "-p", "--info", "-i", "--experimental-rerun"}  # Hydra's flags that take the next argument


class ConfigError(ValueError):
    pass


# `auto`: the engine caps that fit the hardware (see `harness.run_parts.device_caps`), resolved when the run starts.
Cap = Count | Literal["auto"]


class StaticConfig(Strict):
    name: Literal["static"]
    batch_size: Cap


class DynamicConfig(Strict):
    name: Literal["dynamic"]
    batch_size: Cap


class ContinuousConfig(Strict):
    name: Literal["continuous"]
    max_batch_tokens: Cap
    max_num_seqs: Cap
    max_prefill_chunk: Count | None = None
    order: Literal[ORDERS] = "decode_first"
    admission: Literal[ADMISSIONS] = "next_chunk"


StrategyConfig = Annotated[StaticConfig | DynamicConfig | ContinuousConfig, Field(discriminator="name")]


class RealRunnerConfig(Strict):
    name: Literal["real"]
    replicas: Count = 1
    router: Literal[ROUTER_NAMES] = "round_robin"

    @model_validator(mode="after")
    def _one_model(self):
        if self.replicas != 1:
            raise ValueError("replicas > 1 needs runner=sim: a real run drives one model")
        return self


class SimRunnerConfig(Strict):
    name: Literal["sim"]
    hardware: str | dict | None = None  # roofline: a catalogue name, a YAML file, or the figures inline
    profile: str | None = None  # calibrated
    # The serving engine whose host costs and kernels the roofline models: a conf/engine/ name, a file, or figures.
    engine: str | dict = DEFAULT_ENGINE
    compute_efficiency: Fraction | Literal["auto"] = "auto"  # auto: the hardware class's, scaled by the engine's
    # Each of these replaces the engine profile's figure; None keeps it.
    memory_efficiency: Fraction | None = None
    step_overhead_s: Annotated[Number, Field(ge=0, le=10)] | None = None
    seq_overhead_s: Annotated[Number, Field(ge=0, le=1)] | None = None
    token_overhead_s: Annotated[Number, Field(ge=0, le=1)] | None = None
    # Time from a client's send to the engine's queue (HTTP, tokenization): part of every TTFT vllm bench sees.
    frontend_latency_s: Annotated[Number, Field(ge=0, le=60)] | None = None
    # The front end's serial work per request (one event loop parses, tokenizes and hands requests on one by one):
    # the least time between two requests reaching the engine.
    frontend_service_s: Annotated[Number, Field(ge=0, le=10)] | None = None
    # Whether it hands requests that reached it together to the engine together, once all are parsed (vLLM's API
    # server does, as its code reads: README "Bursts of 1,000 ShareGPT requests"), or one at a time (SGLang's).
    frontend_batches: bool | None = None
    # The API the simulated clients call: the chat endpoint adds the engine's `chat_latency_s` to the front end's.
    endpoint: Literal[ENDPOINTS] = "completions"
    chat_latency_s: Annotated[Number, Field(ge=0, le=60)] | None = None
    async_scheduling: bool | None = None  # the host schedules the next step while the GPU runs this one
    # SGLang's --scheduler-recv-interval (an sglang profile's scheduler): decode batches between takes of new requests.
    scheduler_recv_interval: Count | None = None
    # A mixture of experts' grouped GEMMs: their share of the dense GEMMs' efficiency with many tokens per expert,
    # the tokens per expert at which they reach half of it, the GPU time each touched expert costs a layer, and the
    # time each MoE layer costs whatever its experts.
    moe_efficiency: Fraction | None = None
    moe_tokens_half: Annotated[Number, Field(ge=0)] | None = None
    expert_overhead_s: Annotated[Number, Field(ge=0, le=1e-3)] | None = None
    moe_layer_overhead_s: Annotated[Number, Field(ge=0, le=1e-3)] | None = None
    tensor_parallel: Count = 1  # GPUs of one node behind one engine (weights and attention heads split N ways)
    expert_parallel: bool = False  # a mixture's experts spread whole over the tensor-parallel GPUs
    calibration: str | None = None  # a YAML from `python -m harness.sim.calibrate`: its figures replace these
    replicas: Count = 1
    router: Literal[ROUTER_NAMES] = "round_robin"
    router_load_weight: Annotated[Number, Field(ge=0)] = 0.5  # prefix_aware: load against cached prefix (sim.yaml)

    @model_validator(mode="after")
    def _one_cost_model(self):
        if self.hardware and self.profile:
            raise ValueError("give hardware (roofline) or profile (calibrated), not both")
        if not self.hardware and not self.profile:
            raise ValueError("runner=sim needs runner.hardware=<name> (roofline) or runner.profile=<csv from "
                             "python -m harness.sim.step_profile> (calibrated)")
        if self.hardware and self.hardware != "cpu":
            from harness.sim.costmodel.hardware import get_hardware

            get_hardware(self.hardware)  # an unknown name, a missing file or a missing figure: its ValueError
        if self.profile and not Path(self.profile).is_file():
            raise ValueError(f"profile {self.profile!r} does not exist; make one with python -m "
                             "harness.sim.step_profile")
        if self.hardware:
            get_engine(self.engine)  # an unknown name, a missing file or a missing figure: its ValueError
        return self


class HFGenerateRunnerConfig(Strict):
    """Peer: transformers `generate()` on left-padded batches (`harness.peers.hf_generate`)."""

    name: Literal["hf_generate"]
    batch_size: Cap


class HFContinuousRunnerConfig(Strict):
    """Peer: transformers' continuous batching manager (`harness.peers.hf_continuous`)."""

    name: Literal["hf_continuous"]
    max_batch_tokens: Cap
    max_num_seqs: Cap


class OpenAIRunnerConfig(Strict):
    """Peer: any OpenAI-compatible server (`harness.peers.openai_server`)."""

    name: Literal["openai"]
    url: str | None = None  # http://host:port/v1
    model: str | None = None  # the served model's name
    endpoint: Literal[ENDPOINTS] = "completions"
    prompt: Literal["text", "ids"] = "text"
    lengths: Literal["ignore_eos", "generation_config", "none"] = "ignore_eos"
    api_key_env: str | None = None
    timeout_s: Positive = 600
    launch: str | None = None  # a command starting the server: {port} and {model_path} are filled in
    ready_timeout_s: Positive = 120
    # A virtual environment holding the launched server, when its pins clash with ours: {python} is its interpreter.
    server_env: str | None = None

    @model_validator(mode="after")
    def _a_server(self):
        if not self.url and not self.launch:
            raise ValueError("runner=openai needs runner.url=http://<host>:<port>/v1 (a running server) or "
                             "runner.launch='<command with {port}>' (one the run starts)")
        if self.url and self.launch:
            raise ValueError("give runner.url (a running server) or runner.launch (one the run starts), not both")
        if self.url and not self.model:
            raise ValueError("runner.model: name the model the server serves (its /v1/models lists them)")
        if self.launch and self.server_env and not server_python(self.server_env).is_file():
            raise ValueError(f"runner.server_env={self.server_env} has no bin/python: install the server there first "
                             "(vLLM: bash scripts/install-vllm.sh)")
        return self


def server_python(server_env: str) -> Path:
    """The interpreter of a server's own environment; a relative folder is the checkout's."""
    folder = Path(server_env)
    return (folder if folder.is_absolute() else CONF_DIR.parent / folder) / "bin" / "python"


RunnerConfig = Annotated[RealRunnerConfig | SimRunnerConfig | HFGenerateRunnerConfig | HFContinuousRunnerConfig
                         | OpenAIRunnerConfig, Field(discriminator="name")]
# Other systems, run in process or over HTTP, reported in the same tables as our strategies.
PEERS = ("hf_generate", "hf_continuous", "openai")
# `${system:${runner.name},${strategy.name}}`: what a run measured, for folder names: a peer, or our strategy.
OmegaConf.register_new_resolver("system", lambda runner, strategy: runner if runner in PEERS else strategy,
                                replace=True)
MAX_FOLDER_NAME = 200  # bytes; file systems allow 255


def folder_name(text: str) -> str:
    """`text` (a sweep job's overrides) as one folder name, for any value: `/` (which would nest folders) and `%`
    percent-encoded as in URLs, so `runner.url=http://h:8000/v1` reads `runner.url=http:%2F%2Fh:8000%2Fv1`; no
    overrides at all is `defaults`; a name too long for the file system keeps its start and a digest of the
    whole, so every job still has its own folder and a rerun finds it again."""
    name = str(text).replace("%", "%25").replace("/", "%2F") or "defaults"
    if len(name.encode()) > MAX_FOLDER_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        name = name.encode()[:MAX_FOLDER_NAME - 13].decode(errors="ignore") + "~" + digest
    return name


OmegaConf.register_new_resolver("folder_name", folder_name, replace=True)


class ModelShape(BaseModel):
    """The transformers config keys batchlab reads; any other key passes through to transformers."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model_type: str
    vocab_size: Count
    hidden_size: Count
    intermediate_size: Count | None = None  # none in a mixture whose every layer has experts (Qwen3.5's, DeepSeek-V4's)
    num_hidden_layers: Count
    num_attention_heads: Count
    num_key_value_heads: Count | None = None
    max_position_embeddings: Count


class BuiltModel(Strict):
    """tiny-llama: built here from its config with seeded random weights."""

    name: str
    source: Literal["tiny"]
    seed: Seed = 0
    quantization: Literal[QUANTIZATIONS] = "auto"  # the layers' weights; auto: the checkpoint's own
    config: ModelShape


class DescribedModel(Strict):
    """Described by its published config: simulated, or run for real with seeded random weights (timings real,
    outputs meaningless)."""

    name: str
    source: Literal["config"]
    config: ModelShape
    weights: Literal["random"] = "random"
    seed: Seed = 0
    quantization: Literal[QUANTIZATIONS] = "auto"  # the layers' weights; auto: the checkpoint's own


class HubModel(Strict):
    """Any transformers causal LM from the hub (cached) or a local folder."""

    name: str
    source: Literal["hf"]
    trust_remote_code: bool = False
    weights: Literal["pretrained", "random"] = "pretrained"  # random: its config.json only, nothing downloaded
    seed: Seed = 0
    quantization: Literal[QUANTIZATIONS] = "auto"  # the layers' weights; auto: the checkpoint's own


ModelConfig = Annotated[BuiltModel | DescribedModel | HubModel, Field(discriminator="source")]


class KVCacheConfig(Strict):
    block_size: Count  # the model's context bounds it (checked in `validate`)
    num_blocks: Literal["auto"] | Count = "auto"
    memory_fraction: Literal["auto"] | Fraction = "auto"  # auto: the engine's default (vLLM's 0.9)
    prefix_caching: bool = True  # reuse cached prompt prefixes, as vLLM's V1 engine does by default
    # Which free block is handed out next (a cached one is evicted): auto, the engine's (harness.core.kv_cache).
    eviction: Literal["auto", *EVICTION_ORDERS] = "auto"
    dtype: Literal[KV_DTYPES] = "auto"  # the cache's format; auto: the compute dtype (runner=sim takes fp8)


class SLOConfig(Strict):
    ttft_s: Positive | None = None
    tpot_s: Positive | None = None


class ResultsConfig(Strict):
    tables: Literal["csv", "parquet"] = "csv"
    steps: Literal["full", "summary"] = "full"


class RunConfig(Strict):
    strategy: StrategyConfig
    workload: WorkloadConfig
    model: ModelConfig
    runner: RunnerConfig
    concurrency: Cap
    seed: Seed
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", *DTYPE_BYTES] = "auto"
    kernel_backend: Literal[KERNEL_BACKENDS] = "auto"
    kv_cache: KVCacheConfig
    slo: SLOConfig = SLOConfig()
    results: ResultsConfig = ResultsConfig()
    stop_at_eos: bool = False
    save_tokens: bool = False
    save_trace: bool = False
    progress: bool = True
    overwrite: bool = False

    @model_validator(mode="after")
    def _across_keys(self):
        if self.runner.name == "sim" and self.stop_at_eos:
            raise ValueError("stop_at_eos needs runner=real: a simulation computes no tokens, so sees no EOS")
        if self.runner.name != "sim" or not self.runner.hardware:
            formats = {"model.quantization": self.model.quantization, "kv_cache.dtype": self.kv_cache.dtype}
            named = [f"{key}={value}" for key, value in formats.items() if value != "auto"]
            if named:
                raise ValueError(f"{', '.join(named)} is the roofline's (runner=sim runner.hardware=...): this run "
                                 "computes in the model's own dtype (dtype=)")
        if self.runner.name == "sim" and self.runner.expert_parallel and self.runner.profile:
            raise ValueError("runner.expert_parallel is the roofline's (runner.hardware=...), not a calibrated "
                             "profile's")
        return self


def validate(cfg: DictConfig) -> RunConfig:
    """The typed config, or one `ConfigError` naming the key and the problem. Also checks what needs the
    machine or a file: the device, the kernel backend, the model's config (never its weights)."""
    data = plain_config(cfg)
    runner = data.get("runner")
    if isinstance(runner, dict) and runner.get("name") == "sim" and runner.get("calibration"):
        from harness.sim.calibration import load_calibration  # its figures, then validated as if typed

        try:
            data["runner"] = runner | load_calibration(runner["calibration"])
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, data)) from None
    on_cpu = _check_device(config) if config.runner.name in ("real", *PEERS) else bool(
        config.runner.profile or config.runner.hardware == "cpu")
    # `auto` caps are the CPU's or else the GPU's, known once the job sees it
    _check_cache_holds(config, CPU_ENGINE_CAPS[0] if on_cpu else None)
    try:
        model = read_model_config(config.model)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name={config.model.name!r}: {e}") from None
    if config.runner.name == "real" and (unpaged := _layers_not_paged(model)):
        raise ConfigError(f"model {config.model.name!r} has {unpaged}, which runner=real cannot run (its paged "
                          "attention keeps one cache of one head size in every layer and attends to every cached "
                          "token): use runner=sim, or a peer that serves the model")
    context = model.get("max_position_embeddings")
    if context and config.kv_cache.block_size > context:
        raise ConfigError(f"kv_cache.block_size={config.kv_cache.block_size} is larger than the model's whole "
                          f"context ({context} tokens)")
    longest = getattr(config.workload, "longest_request", 0)  # the random dataset knows its lengths up front
    if context and longest > context:
        raise ConfigError(f"workload: random requests of up to {longest} tokens (prefix + input + output) exceed "
                          f"{config.model.name}'s context of {context}")
    return config


def _layers_not_paged(model: dict) -> str:
    """What layers of `model` this harness's paged attention cannot run, in words ("" if none)."""
    found = []
    if num_linear_layers(model):
        found.append("linear-attention layers (Gated DeltaNet)")
    if "chunked_attention" in (model.get("layer_types") or ()):
        found.append("chunked attention layers (Llama 4)")
    if COMPRESSED_KINDS & set(model.get("layer_types") or ()):
        found.append("compressed attention layers (DeepSeek-V4)")
    elif model.get("index_topk"):
        found.append("sparse attention layers (DeepSeek-V3.2's indexer)")
    if model.get("per_layer_config") or model.get("num_kv_shared_layers") or model.get("hidden_size_per_layer_input"):
        found.append("layers of more than one head size, shared caches or per-layer inputs (Gemma 4)")
    return " and ".join(found)


def _check_cache_holds(config: RunConfig, auto_concurrency: int | None) -> None:
    strategy = config.strategy
    most = strategy.max_num_seqs if strategy.name == "continuous" else strategy.batch_size
    most = auto_concurrency if most == "auto" else most
    if config.kv_cache.num_blocks != "auto" and most is not None and config.kv_cache.num_blocks < most:
        raise ConfigError(f"kv_cache.num_blocks={config.kv_cache.num_blocks} cannot hold one block for each of the "
                          f"{most} requests {strategy.name} may run at once")


def _check_device(config: RunConfig) -> bool:
    """Whether the run will be on the CPU; raises ConfigError for a device or kernel backend it cannot have."""
    import torch  # a real run needs it anyway; a simulated one never gets here

    cuda = torch.cuda.is_available()
    if config.device == "cuda" and not cuda:
        raise ConfigError("device=cuda but torch sees no CUDA device; use device=auto or device=cpu")
    on_cpu = config.device == "cpu" or not cuda
    if config.kernel_backend == "triton" and on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("kernel_backend=triton needs a CUDA device (or TRITON_INTERPRET=1 to interpret the "
                          "kernels on the CPU, slowly); use kernel_backend=auto")
    return on_cpu


def expand_dict_overrides(overrides: list[str]) -> list[str]:
    """`key={...}` replaces the whole node, as a user means it: Hydra would merge the dict into the node, keeping
    keys of the old value (and refuse new ones). Becomes `key=null` then `++key={...}` (which replaces a null
    node, a dict or not); sweeps are left alone."""
    parser, expanded, takes_value = OverridesParser.create(), [], False
    for text in overrides:
        flag, takes_value = takes_value or text.startswith("-"), text in VALUE_FLAGS
        if flag:  # command-line flags (-m, --cfg job, ...) and their values pass through
            expanded.append(text)
            continue
        try:
            override = parser.parse_override(text)
        except Exception:  # Hydra reports a malformed override itself, in its own words
            expanded.append(text)
            continue
        replaces_dict = (override.type.name == "CHANGE" and override.value_type == ValueType.ELEMENT
                         and isinstance(override.value(), dict) and override.package is None)
        expanded += [f"{override.key_or_group}=null", f"++{text}"] if replaces_dict else [text]
    return expanded


def check_group_choices(overrides: list[str]) -> None:
    """`model=llama-9b` names no file in `conf/model/`: one ConfigError listing the choices, before Hydra (whose
    own message spans several lines) composes anything. Sweeps (`strategy=static,dynamic`) are checked per value."""
    parser, takes_value = OverridesParser.create(), False
    for text in overrides:
        flag, takes_value = takes_value or text.startswith("-"), text in VALUE_FLAGS
        if flag:
            continue
        try:
            override = parser.parse_override(text)
        except Exception:  # malformed: Hydra says so itself
            continue
        group = CONF_DIR / override.key_or_group
        if override.package is not None or not group.is_dir() or override.is_delete():
            continue
        choices = sorted(p.stem for p in group.glob("*.yaml"))
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            if isinstance(value, str) and value not in choices:
                raise ConfigError(f"{override.key_or_group}={value} is not one of conf/{override.key_or_group}/: "
                                  f"{', '.join(choices)}")


def check_output_dirs(overrides: list[str]) -> None:
    """`hydra.run.dir` or `hydra.sweep.dir` at a file, or under one: one ConfigError, before Hydra tries to create
    it (and fails with a traceback). A value with an interpolation is checked up to it."""
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or key.lstrip("+~") not in ("hydra.run.dir", "hydra.sweep.dir"):
            continue
        folder = Path(value.split("${")[0].strip("'\""))
        for path in (folder, *folder.parents):
            if path.exists() and not path.is_dir():
                raise ConfigError(f"{key.lstrip('+~')}={value}: {path} is a file, not a folder")


def compose_config(overrides: list[str]) -> DictConfig:
    """The same config `python -m harness` would build from these overrides, for the other entry points."""
    check_group_choices(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=expand_dict_overrides(overrides))

