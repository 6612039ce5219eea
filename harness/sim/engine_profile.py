"""A serving engine's own costs, apart from the GPU's: a named, cited profile in `conf/engine/` (`runner.engine=`),
a user's YAML file, or the figures inline.

The host side — the front end's latency and serial work per request (and whether it hands requests that reached it
together to the engine together), the scheduler's time per step, per sequence and per token, and whether the engine
schedules the next step while the GPU runs this one (async scheduling) — and how well its kernels use the GPU: the
share of peak memory bandwidth they reach, a scale on the hardware class's compute efficiency, and how the grouped
GEMMs of a mixture of experts fall short of dense ones. Every figure was fitted to published runs of that engine
(the profile's file says which), or measured elsewhere and held by the fit (`held`, each with its source), and may
be overridden one by one (`runner.step_overhead_s=...`) or all together by a calibration (`runner.calibration=`). A
profile also names how its engine schedules continuous batching (`scheduler`: vLLM's or SGLang's,
`strategies.CONTINUOUS_SCHEDULERS`).
"""

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from harness.catalogue import catalogue_entry, catalogue_names
from harness.sim.calibration import BOUNDS
from workloads.config import Strict, one_line

CATALOGUE_DIR = Path(__file__).resolve().parents[2] / "conf" / "engine"
DEFAULT_ENGINE = "vllm-v1"
# The figures `harness.sim.fit_engine` searches: a calibration's, the compute share as a scale on the hardware class's
# (and a scale of its own on the GPUs without FlashAttention-3).
FITTED_FIGURES = ("compute_scale", "fa2_compute_scale",
                  *(name for name in asdict(BOUNDS) if name != "compute_efficiency"))
Seconds = Annotated[float, Field(ge=0, le=10)]
Share = Annotated[float, Field(gt=0, le=1)]


class EngineSpec(Strict):
    """What an engine profile's file says."""

    name: str
    describes: str = ""  # the engine and versions the figures were fitted on
    fitted_on: list[str] = []  # the published runs they were fitted to
    # Each published run's relative error under these figures (fitted or held out), as `fit_engine --write` found it.
    errors: dict[str, dict[str, float | str]] = {}
    memory_efficiency: Share
    compute_scale: Annotated[float, Field(gt=0, le=2)] = 1.0  # x the hardware class's compute efficiency
    fa2_compute_scale: Annotated[float, Field(gt=0, le=2)] | None = None  # on GPUs without FlashAttention-3
    step_overhead_s: Seconds
    seq_overhead_s: Seconds
    token_overhead_s: Seconds
    frontend_latency_s: Seconds
    frontend_service_s: Seconds
    chat_latency_s: Seconds = 0.0
    frontend_batches: bool = False
    async_scheduling: bool = False
    scheduler: Literal["vllm", "sglang"] = "vllm"
    scheduler_recv_interval: Annotated[int, Field(ge=1)] = 1
    moe_efficiency: Share = 1.0
    moe_tokens_half: Annotated[float, Field(ge=0)] = 0.0
    expert_overhead_s: Annotated[float, Field(ge=0, le=1e-3)] = 0.0
    moe_layer_overhead_s: Annotated[float, Field(ge=0, le=1e-3)] = 0.0
    cache_sizing: Literal["share", "vllm", "sglang"] = "share"
    activation_traffic: bool = False
    flash_attention: bool = False
    decode_rows_in_query_tiles: bool = False
    gemm_knee: bool = False
    stream_bandwidth_cap: bool = False
    padded_fp4_experts: bool = False
    # Figures measured elsewhere, which a fit keeps as they are: each with the measurement it was read from.
    held: dict[str, str] = {}

    @model_validator(mode="after")
    def _held_are_fitted_figures(self):
        unknown = sorted(set(self.held) - set(FITTED_FIGURES))
        if unknown:
            raise ValueError(f"held: {', '.join(unknown)} is not a figure a fit searches ({', '.join(FITTED_FIGURES)})")
        return self


@dataclass(frozen=True)
class EngineProfile:
    name: str
    memory_efficiency: float  # share of peak memory bandwidth its kernels reach
    compute_scale: float  # its kernels' share of peak FLOP/s, relative to the hardware class's figure
    step_overhead_s: float  # host time per step (scheduling, launches; CUDA graphs as the engine uses them)
    seq_overhead_s: float  # and per sequence in the step (sampling, output processing)
    token_overhead_s: float  # and per token in the step (building positions and cache slots)
    frontend_latency_s: float  # from a client's send to the engine's queue (HTTP, tokenization)
    frontend_service_s: float  # the front end's serial work per request
    # What the chat endpoint adds to that latency: the request's messages rendered through the model's chat template
    # and the chat serving path's own work, before its prompt is tokenized as a completion's is.
    chat_latency_s: float = 0.0
    # Whether the front end hands the requests that reached it together to the engine together, once it has parsed
    # them all (`harness.core.replay.Client`: vLLM's API server, 0.10 on, awaits each request's tokens between the two),
    # rather than one by one as it parses each.
    frontend_batches: bool = False
    async_scheduling: bool = False  # the host's step work overlaps the GPU's previous step
    # How it schedules continuous batching: vLLM's way (`strategies.continuous`) or SGLang's (`strategies.sglang`:
    # prefill batches apart, admission against a reserve for running requests' output still to come).
    scheduler: str = "vllm"
    # SGLang's --scheduler-recv-interval: decode batches between the scheduler's takes of arrived requests
    # (`strategies.sglang.RecvSkipper`); 1, SGLang's default, takes them in at every step. SGLang's scheduler only.
    scheduler_recv_interval: int = 1
    # Expert GEMMs (grouped, one small GEMM per expert) reach `moe_efficiency` of the dense GEMMs' compute
    # efficiency with many tokens per expert, and half that at `moe_tokens_half` tokens per expert.
    moe_efficiency: float = 1.0
    moe_tokens_half: float = 0.0
    # GPU time each expert a step touches costs a mixture's layer whatever its tokens (the grouped GEMM's tiles of
    # that expert, each waiting on its own weights).
    expert_overhead_s: float = 0.0
    # GPU time each MoE layer costs whatever its tokens and experts: the chain of small kernels around the grouped
    # GEMMs (routing, sorting tokens by expert, quantizing their activations, the activation, the weighted sum), each
    # a few microseconds at a decode batch's size.
    moe_layer_overhead_s: float = 0.0
    # How it sizes its KV cache from `kv_cache.memory_fraction` of the GPU (`costmodel.startup_memory`): `vllm`
    # holds back its profile run's peak as well as the weights (default share 0.9, --gpu-memory-utilization);
    # `sglang`'s share is the weights' and the cache's alone (--mem-fraction-static, by default SGLang's own from the
    # GPU's memory); `share`: the weights and the cache fill the share, nothing else counted.
    cache_sizing: str = "share"
    # Whether the memory-bound kernels between GEMMs (norms, rotary, activation: `Architecture.
    # activation_bytes_per_token`) cost GPU time per token at the engine's bandwidth share. False: a profile whose
    # fitted per-token host time stands for them (`vllm-0.5`, fitted before they were counted).
    activation_traffic: bool = False
    # Whether its attention runs at the hardware file's measured FlashAttention rates where it has them
    # (`Hardware.attention_share`: FlashAttention-3 on Hopper, as vLLM's V1 engine and SGLang run it). False: at the
    # GEMMs' fitted compute share (`vllm-0.5`, which ran FlashAttention-2 on Hopper, fitted so).
    flash_attention: bool = False
    # Whether its decode rows share their step's variable-length attention call with the prompt chunks, each filling
    # one row of FlashAttention-2's query tile (`Hardware.attention_query_tile`) where the GPU runs that kernel: vLLM's
    # V1 engine makes one call a layer. False: a decode kernel of their own (vLLM 0.5's paged attention, SGLang's
    # decode batches apart from its prefill batches).
    decode_rows_in_query_tiles: bool = False
    # Whether a dense GEMM's time near the ridge is the smooth norm of its compute and memory bounds that GEMMs
    # measure (`roofline.GEMM_KNEE_POWER`). False: their max (`vllm-0.5`, fitted so).
    gemm_knee: bool = False
    # Its compute scale on the GPUs whose attention is FlashAttention-2 (`Hardware.attention_query_tile`: Ampere and
    # Ada) where its kernels reach another share of the class's figure than on Hopper; None: `compute_scale`.
    fa2_compute_scale: float | None = None
    # Whether its kernels stream memory no faster than the GPU was measured to where the hardware file says
    # (`Hardware.stream_bandwidth`), each dense GEMM taking the GPU's measured fixed time beside
    # (`Hardware.gemm_fixed_s`): its `memory_efficiency` was measured on a Hopper GPU, which streams at that share
    # of its datasheet. False: a share fitted with each GPU's own shortfall in it (`vllm-0.5`).
    stream_bandwidth_cap: bool = False
    # Whether it holds FP4 experts padded to its MoE kernels' tiles, each expert's hidden width to a multiple of 256
    # and each GPU's share of its intermediate width to one of 128: vLLM's Marlin (Hopper, Ampere) and TensorRT-LLM
    # (Blackwell) MXFP4 kernels (`mxfp4_round_up_hidden_size_and_intermediate_size`), which gpt-oss's 2880-wide
    # experts fill to 3072 x 2944 on one GPU: 9% more bytes held, read and computed.
    padded_fp4_experts: bool = False
    held: tuple[str, ...] = ()  # figures a fit keeps (`EngineSpec.held`: measured elsewhere)

    def __post_init__(self):
        if self.scheduler_recv_interval != 1 and self.scheduler != "sglang":
            raise ValueError(f"scheduler_recv_interval is SGLang's --scheduler-recv-interval; the {self.name} profile "
                             f"schedules as {self.scheduler} does")

    def compute_efficiency_on(self, hardware) -> float:
        """The share of `hardware`'s peak FLOP/s its kernels reach: the class's figure times its scale there."""
        fa2 = hardware.attention_query_tile and self.fa2_compute_scale is not None
        return hardware.compute_efficiency * (self.fa2_compute_scale if fa2 else self.compute_scale)

    def moe_share(self, tokens_per_expert):
        """The share of the dense compute efficiency an expert GEMM of this many tokens reaches (arrays too)."""
        return self.moe_efficiency * tokens_per_expert / (tokens_per_expert + self.moe_tokens_half)

    def overridden(self, figures: dict) -> "EngineProfile":
        """This profile with the figures given (None: keep the profile's)."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in figures.items() if k in names and v is not None})


def engine_catalogue() -> list[str]:
    return catalogue_names(CATALOGUE_DIR)


def get_engine(choice) -> EngineProfile:
    """`choice`: a catalogue name, a YAML file's path, or a mapping of the figures. Raises ValueError naming the
    problem (an unknown name lists the catalogue)."""
    choice, where = catalogue_entry(choice, CATALOGUE_DIR, "engine", "runner.engine")
    try:
        spec = EngineSpec.model_validate(choice)
    except ValidationError as e:
        raise ValueError(f"{where}: {one_line(e, choice)}") from None
    names = {f.name for f in fields(EngineProfile)} - {"held"}
    try:
        return EngineProfile(**spec.model_dump(include=names), held=tuple(spec.held))
    except ValueError as e:  # figures that do not go together (`EngineProfile.__post_init__`)
        raise ValueError(f"{where}: {e}") from None


def fixture_engine(setup: dict) -> str:
    """The profile a published run's engine is judged by: its `setup.engine_profile`, else by engine and version
    (vLLM before 0.6 is `vllm-0.5`; later vLLM, the V1 engine, `vllm-v1`; SGLang `sglang`)."""
    if setup.get("engine_profile"):
        return setup["engine_profile"]
    engine, version = setup.get("engine", "vllm"), str(setup.get("engine_version", ""))
    if engine == "sglang":
        return "sglang"
    return "vllm-0.5" if version.startswith(("0.4", "0.5")) else DEFAULT_ENGINE


def frontend_latency(figures, endpoint: str) -> float:
    """A request's time from the client's send to the engine's queue through `endpoint` (completions or chat), from
    an engine profile's figures or a calibration's."""
    return figures.frontend_latency_s + (figures.chat_latency_s if endpoint == "chat" else 0.0)


# Models whose chat vLLM renders in OpenAI's Harmony format with its Rust library (`openai_harmony`), not through a
# Jinja chat template on the API server's event loop.
HARMONY_MODEL_TYPES = ("gpt_oss",)


def front_end(figures, endpoint: str, model_type: str, batches: bool) -> dict:
    """The front end a client of `endpoint` passes, as `replay` takes it, from an engine profile's figures or a
    calibration's: its latency, whether it `batches`, and its serial work on one request: the parsing
    (`frontend_service_s`), and on a front end that batches (vLLM 0.10-0.11's event loop renders every chat request of
    a burst before it hands any over) the rendering of its messages through the model's chat template too
    (`chat_latency_s`), save for a chat rendered in Rust (Harmony). One at a time, the template's time is latency
    alone."""
    renders = batches and endpoint == "chat" and model_type not in HARMONY_MODEL_TYPES
    return {"frontend_latency_s": frontend_latency(figures, endpoint),
            "frontend_service_s": figures.frontend_service_s + (figures.chat_latency_s if renders else 0.0),
            "frontend_batches": batches}


def configured_engine(runner_cfg) -> EngineProfile:
    """`runner.engine`'s profile with the figures the run config (or its calibration) sets one by one."""
    figures = {name: getattr(runner_cfg, name, None) for name in (f.name for f in fields(EngineProfile))}
    return get_engine(runner_cfg.engine).overridden(figures | {"name": None})
