"""A run measured elsewhere, as the simulator needs it: the workload as it was sent, the engine's setup, the GPU,
and the metrics it got.

Read from a `vllm bench serve --save-result` JSON (with `--save-detailed`, its per-request `input_lens` and
`output_lens` give the workload exactly) plus a `setup` block for what the JSON itself does not say: `hardware`
and `model` (names from `conf/hardware/`, `conf/model/`), the engine's caps, and for a random dataset saved without
details its lengths. `tests/fixtures/published/` holds published runs in this shape.

Or from a run folder of this harness (`runner=openai` against your server, `runner=real` on your GPU): its requests
table gives each request's arrival and lengths exactly, `summary.json` the metrics, `config.yaml` the client; what
it cannot say (the GPU, a model name from the catalogue when it ran a hub model, the server's caps) comes from
`setup`, and before that from the nearest `setup.yaml` at or above the run folder (`harness.peers.vllm_sweep` writes
one beside its runs).
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from harness.analysis.results import find_run_folders, read_status
from harness.config import ENDPOINTS
from harness.core.kv_cache import EVICTION_ORDERS
from harness.model_spec import described_model
from harness.sim.engine_profile import fixture_engine
from workloads import RequestSpec

log = logging.getLogger(__name__)

# vllm bench result keys (milliseconds or per second) → our summary keys (SI), and the factor between them.
METRICS = {
    "output_throughput": ("output_throughput_tps", 1.0),
    "request_throughput": ("request_throughput_rps", 1.0),
    "median_tpot_ms": ("tpot_s_p50", 1e-3),
    "mean_tpot_ms": ("tpot_s_mean", 1e-3),
    "median_ttft_ms": ("ttft_s_p50", 1e-3),
    "mean_ttft_ms": ("ttft_s_mean", 1e-3),
    "median_e2el_ms": ("e2e_s_p50", 1e-3),
    "mean_e2el_ms": ("e2e_s_mean", 1e-3),
    "median_itl_ms": ("itl_s_p50", 1e-3),  # shown beside a prediction, never fitted (`calibrate.WEIGHTS`)
}


class MeasuredRunError(ValueError):
    """A measured run that cannot be replayed: the message names the file and what is missing."""


@dataclass
class MeasuredRun:
    name: str
    source: str
    hardware: str
    model: str
    requests: list[RequestSpec]
    max_concurrency: int | None
    metrics: dict[str, float]  # our summary keys, SI units
    tensor_parallel: int = 1
    max_num_seqs: int | None = None  # None: the hardware's vLLM defaults
    max_num_batched_tokens: int | None = None
    # --gpu-memory-utilization (vLLM) or --mem-fraction-static (SGLang); None: the engine's default
    memory_fraction: float | None = None
    served_over_http: bool = True  # vllm bench serve (a front end in the way) or the offline LLM class
    setup: dict = field(default_factory=dict)
    # Requests whose TTFT the benchmark recorded as 0 and averaged in (see `_zero_ttft_requests`).
    zero_ttft_requests: frozenset[int] = frozenset()
    # The folder holding this run folder, for runs found inside a folder given: its repeats of one load
    # (`concurrency-4/seed-1`, `-2`, ...) share it. None for a run given by itself.
    load: str | None = None

    @property
    def quantization(self) -> str:
        """The weights' format it served (`setup.quantization`: bf16, fp8, fp4; auto: the checkpoint's own)."""
        return str(self.setup.get("quantization", "auto"))

    @property
    def kv_cache_dtype(self) -> str:
        return str(self.setup.get("kv_cache_dtype", "auto"))

    @property
    def endpoint(self) -> str:
        """The API its client called (`setup.endpoint`): completions, or chat (vllm bench --backend openai-chat)."""
        return str(self.setup.get("endpoint", "completions"))

    @property
    def expert_parallel(self) -> bool:
        return bool(self.setup.get("expert_parallel", False))

    @property
    def eviction(self) -> str:
        """Which free block its engine handed out next (`setup.eviction`, `kv_cache.eviction`'s choices; auto: the
        engine's as the profile's scheduler keeps them, `harness.core.kv_cache.CACHE_POLICIES`)."""
        return str(self.setup.get("eviction", "auto"))

    @property
    def host_frontend_s(self) -> float | None:
        """The serial front-end work a request took on the deployment it ran on (parsing, and a chat request's template
        rendering), where a run of that deployment shows it (`setup.host_frontend_s`, with `setup.host_frontend_from`
        saying which): it stands in for the engine profile's. None: the profile's."""
        seconds = self.setup.get("host_frontend_s")
        return float(seconds) if seconds is not None else None

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine kept computed blocks cached (`setup.prefix_caching`; else its default: on in vLLM's V1
        engine and SGLang, off in vLLM 0.5). With it, a request preempted for want of blocks finds the blocks it had
        computed (as its engine names them) again unless they were evicted since, instead of computing them anew: a
        cache that holds one long prompt at a time would otherwise recompute every chunk of the next one at each
        preemption."""
        return bool(self.setup.get("prefix_caching", fixture_engine(self.setup) != "vllm-0.5"))


def load_measured(path: str | Path, seed: int = 0) -> MeasuredRun:
    """A vllm bench result JSON with its `setup` block. vllm bench does not save arrival times: at a finite rate
    they are redrawn (Poisson or gamma, seeded) and scaled to the nominal mean rate, since the draw's own rate
    varies by ±4.5% over 500 requests and a rate-bound run's throughput would follow it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MeasuredRunError(f"measured run {str(path)!r} is not a readable JSON file: {e}") from None
    setup = data.get("setup", {})
    hardware, model = data.get("hardware") or setup.get("hardware"), data.get("model") or setup.get("model")
    if not hardware or not model:
        raise MeasuredRunError(
            f'measured run {str(path)!r}: say which GPU and model it ran on ("hardware" and '
            '"model", names from conf/hardware/ and conf/model/)'
        )
    check_setup(setup, path)
    metrics = {
        ours: float(data[theirs]) * scale for theirs, (ours, scale) in METRICS.items() if data.get(theirs) is not None
    }
    if "output_throughput_tps" not in metrics:
        raise MeasuredRunError(f"measured run {str(path)!r} has no output_throughput to compare with")
    input_lens, output_lens = _lengths(data, setup, path)
    arrivals = _arrivals(data, len(input_lens), seed)
    requests = [
        # An empty completion (output 0) still ran its prefill and sampled one token: run it as one.
        RequestSpec(i, float(t), (), max(int(o), 1), prompt_len=int(p))
        for i, (t, p, o) in enumerate(zip(arrivals, input_lens, output_lens))
    ]
    concurrency = data.get("max_concurrency")
    return MeasuredRun(
        name=path.stem,
        source=str(data.get("source", path)),
        hardware=hardware,
        model=model,
        requests=requests,
        max_concurrency=int(concurrency) if concurrency else None,
        metrics=metrics,
        tensor_parallel=int(setup.get("tensor_parallel", 1)),
        max_num_seqs=setup.get("max_num_seqs"),
        max_num_batched_tokens=setup.get("max_num_batched_tokens"),
        memory_fraction=memory_share(setup),
        served_over_http=bool(setup.get("served_over_http", True)),
        setup=setup,
        zero_ttft_requests=_zero_ttft_requests(data, setup, output_lens, path),
    )


def memory_share(setup: dict, configured="auto") -> float | None:
    """The share of each GPU's memory the run's engine was given for weights and cache (`setup`'s
    gpu_memory_utilization or mem_fraction_static, else `configured`); None: its engine's default."""
    share = setup.get("gpu_memory_utilization", setup.get("mem_fraction_static", configured))
    return None if share == "auto" else float(share)


# Figures of a GPU, which a replay takes from the run's hardware file (`hardware`: a catalogue name, or a file of its
# own for a GPU the catalogue lacks or one that reaches less than its datasheet), never from one run's setup.
GPU_FIGURES = ("host_bandwidth_gbps", "host_compute_share")


def check_setup(setup: dict, path: Path) -> None:
    """Raises MeasuredRunError naming the `setup` value of the run at `path` that a replay cannot use."""
    if setup.get("endpoint", "completions") not in ENDPOINTS:
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.endpoint is {setup['endpoint']!r}; it must be "
                               f"one of {', '.join(ENDPOINTS)} (the API its client called)")
    if setup.get("eviction", "auto") not in ("auto", *EVICTION_ORDERS):
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.eviction is {setup['eviction']!r}; it must be "
                               f"auto or one of {', '.join(EVICTION_ORDERS)} (which free block its engine took next)")
    seconds = setup.get("host_frontend_s")
    if seconds is not None and not (isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0
                                    and setup.get("host_frontend_from")):
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.host_frontend_s must be a positive number of "
                               "seconds, with setup.host_frontend_from saying which measurement shows it")
    interval = setup.get("scheduler_recv_interval", 1)
    if not (isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1):
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.scheduler_recv_interval is {interval!r}; it must "
                               "be a whole number of decode steps, 1 or more (SGLang's --scheduler-recv-interval)")
    if figure := next((key for key in GPU_FIGURES if key in setup), None):
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.{figure} is a figure of its GPU, which a replay "
                               "takes from the run's hardware file: name one that gives it (hardware: my_gpu.yaml, "
                               "as conf/hardware/ has them)")


def _zero_ttft_requests(data: dict, setup: dict, output_lens: list[int], path: Path) -> frozenset[int]:
    """The requests vllm bench counted with a TTFT of 0. Its client of 2024 (vLLM 0.5) timed the first token at
    the first chunk carrying text, so an empty completion (the model's first token was its end) kept TTFT 0, and
    the mean and median TTFT it reported include those zeros: in Lambda's Llama-3-70B runs 78 of 320 requests,
    which moves the median by a third. A JSON with per-request `ttfts` shows them; one saved without says so with
    `setup.empty_completion_ttft: zero` (the default, `timed`, is a client that times every completion)."""
    convention = setup.get("empty_completion_ttft", "timed")
    if convention not in ("zero", "timed"):
        raise MeasuredRunError(f"measured run {str(path)!r}: setup.empty_completion_ttft is zero or timed, "
                               f"not {convention!r}")
    if "ttfts" in data:
        return frozenset(i for i, ttft in enumerate(data["ttfts"]) if ttft == 0)
    if convention == "zero":
        return frozenset(i for i, n in enumerate(output_lens) if n == 0)
    return frozenset()


def _lengths(data: dict, setup: dict, path: Path) -> tuple[list[int], list[int]]:
    if "input_lens" in data and "output_lens" in data:
        return data["input_lens"], data["output_lens"]
    n = data.get("num_prompts") or data.get("completed")
    how = setup.get("lengths")
    if n and how in ("totals", "sharegpt_profile"):
        if not data.get("total_input_tokens") or not data.get("total_output_tokens"):
            raise MeasuredRunError(f"measured run {str(path)!r}: setup.lengths={how} needs total_input_tokens and "
                                   "total_output_tokens")
        return _lengths_from_totals(int(n), int(data["total_input_tokens"]), int(data["total_output_tokens"]), how)
    if n and "random_input_range" in setup and "random_output_range" in setup:
        # A random dataset whose lengths were drawn from a range and not saved (InferenceX's `--random-range-ratio
        # 0.8`: uniform in [0.8 L, L]): drawn again from it, seeded.
        rng = np.random.default_rng(0)
        return [rng.integers(low, high + 1, size=n).tolist() for low, high in
                (setup["random_input_range"], setup["random_output_range"])]
    if n and "random_input_len" in setup and "random_output_len" in setup:
        if setup.get("random_range_ratio", 0.0):
            raise MeasuredRunError(
                f"measured run {str(path)!r}: a random range ratio needs the per-request "
                "lengths (vllm bench --save-detailed)"
            )
        return [setup["random_input_len"]] * n, [setup["random_output_len"]] * n
    raise MeasuredRunError(
        f"measured run {str(path)!r} does not say its requests' lengths: save it with vllm bench "
        "--save-detailed (input_lens, output_lens), or give setup.random_input_len and "
        "random_output_len with num_prompts, or setup.lengths (totals, sharegpt_profile) with the token totals"
    )


def _lengths_from_totals(n: int, total_input: int, total_output: int, how: str) -> tuple[list[int], list[int]]:
    """Per-request lengths for a published run that gives only its token totals (a `vllm bench` printout): the
    totals spread evenly (`totals`: a random dataset of fixed lengths, whose outputs may stop early), or ShareGPT's
    embedded length profile drawn with a fixed seed and scaled to the totals (`sharegpt_profile`: vllm bench's
    sharegpt dataset). Either keeps the work the run did; only the spread between requests is this project's."""
    if how == "totals":
        return _spread(total_input, n), _spread(total_output, n)
    from workloads import build_workload

    cfg = {"name": "sharegpt", "source": "sharegpt", "num_requests": n, "seed": 0, "arrival": "offline"}
    specs = build_workload(cfg, 32000, None, 1 << 20, with_ids=False).requests
    prompts = np.array([s.prompt_len for s in specs], dtype=float)
    outputs = np.array([s.max_new_tokens for s in specs], dtype=float)
    return _scaled(prompts, total_input), _scaled(outputs, total_output)


def _spread(total: int, n: int) -> list[int]:
    return [total // n + (i < total % n) for i in range(n)]


def _scaled(lengths: np.ndarray, total: int) -> list[int]:
    """`lengths` scaled to sum to `total`, each at least 1, rounded so the sum is exact."""
    scaled = np.maximum(lengths * total / lengths.sum(), 1.0)
    rounded = np.floor(scaled).astype(int)
    short = total - int(rounded.sum())
    # The most rounded down first; a stable sort breaks ties (lengths drawn alike) by position, where numpy's default
    # breaks them as the CPU's SIMD sort does (AVX-512, AVX2 and none each differently): the same lengths everywhere.
    order = np.argsort(rounded - scaled, kind="stable")
    rounded[order[:max(short, 0)]] += 1
    return rounded.tolist()


def _arrivals(data: dict, n: int, seed: int) -> np.ndarray:
    rate = data.get("request_rate", "inf")
    if rate in ("inf", None) or rate == float("inf"):
        return np.zeros(n)
    from workloads.arrivals import arrival_times

    burstiness = float(data.get("burstiness", 1.0))
    times = arrival_times(
        "gamma" if burstiness != 1.0 else "poisson", n, np.random.default_rng(seed), float(rate), burstiness
    )
    return times * ((n - 1) / float(rate) / times[-1]) if n > 1 and times[-1] > 0 else times


def load_measured_runs(paths: list[str], setup: dict | None = None) -> list[MeasuredRun]:
    """Every measured run under `paths`: vllm bench JSONs, run folders, or folders holding either at any depth (a
    sweep of `runner=openai` runs, say). `setup` fills in what run folders do not say (`hardware`, `model`,
    `tensor_parallel`, `max_num_seqs`, ...). A run folder whose run did not finish is left out, said so in the log;
    a path holding no measured run at all is a `MeasuredRunError`."""
    found: list[tuple[Path, MeasuredRun]] = []  # each run with where it was read
    for path in map(Path, paths):
        if not path.is_dir():
            found.append((path, load_measured(path)))
            continue
        folders = find_run_folders(path)
        finished = [f for f in folders if _finished(f)]
        for folder in sorted(set(folders) - set(finished)):
            log.warning("measured runs: %s left out: its run did not finish (%s)", folder,
                        read_status(folder).get("status", "no summary.json"))
        inside = [p for p in sorted(path.rglob("*.json")) if not any(p.is_relative_to(f) for f in folders)
                  and not any(part.startswith(".") for part in p.relative_to(path).parts) and _bench_result(p)]
        here = [(p, load_measured(p)) for p in inside] + [(f, load_run_folder(f, sweep_setup(f) | (setup or {})))
                                                          for f in finished]
        for where, run in here:
            if where.parent != path.parent:  # found inside `path`, not `path` itself
                run.load = where.parent.relative_to(path.parent).as_posix()
        if not here:
            raise MeasuredRunError(f"{str(path)!r} holds no measured run at any depth: no vllm bench JSON and no "
                                   f"finished run folder{f' ({len(folders)} that did not finish)' if folders else ''}")
        found += here
    runs = _named(found)
    for run in runs:  # the simulator must know each run's model before it replays one
        try:
            described_model(run.model)
        except ValueError as e:
            raise MeasuredRunError(f"measured run {run.source!r}: {e} (or name it: --setup model=<name>)") from None
    return runs


# What a sweep's run folders do not say of their runs, written once beside them: a mapping of `setup` keys.
SETUP_FILE = "setup.yaml"


def sweep_setup(folder: Path) -> dict:
    """The `setup` the nearest `SETUP_FILE` at or above run folder `folder` gives (a `hardware` file named relative to
    it is found beside it); {} where there is none."""
    for place in [folder, *folder.resolve().parents]:
        file = place / SETUP_FILE
        if not file.is_file():
            continue
        try:
            setup = yaml.safe_load(file.read_text())
        except yaml.YAMLError as e:
            raise MeasuredRunError(f"{str(file)!r} is not YAML: {e}") from None
        if not isinstance(setup, dict):
            raise MeasuredRunError(f"{str(file)!r} must map setup keys to values (hardware: ..., max_num_seqs: ...)")
        hardware = setup.get("hardware")
        if isinstance(hardware, str) and (place / hardware).is_file():
            setup["hardware"] = str(place / hardware)
        return setup
    return {}


def _named(found: list[tuple[Path, MeasuredRun]]) -> list[MeasuredRun]:
    """The runs, each named by the last parts of its path, as many as make every name unique: a sweep's jobs share
    folder names (`concurrency-4/seed-1`, `concurrency-8/seed-1`)."""
    places = [(where.with_suffix("") if where.is_file() else where).resolve().parts for where, _ in found]
    depth = 1
    while len({place[-depth:] for place in places}) < len(places) and depth < max(map(len, places), default=1):
        depth += 1
    for place, (_, run) in zip(places, found):
        run.name = "/".join(place[-depth:])
    return [run for _, run in found]


def _bench_result(path: Path) -> bool:
    """Whether a JSON file found in a folder is a benchmark's result (and not a model's config or tokenizer)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "output_throughput" in data


def _finished(folder: Path) -> bool:
    """A run folder with a summary whose status, if it has one, says finished."""
    return (folder / "summary.json").is_file() and read_status(folder).get("status", "finished") == "finished"


# Prompt tokens a server's prefix cache may hold in a run the simulator replays: a shared first block now and then,
# not prompts the server has seen before.
MAX_CACHED_PROMPT_SHARE = 0.01


def cached_prompt_share(summary: dict) -> float:
    """The share of a run's prompt tokens its server's prefix cache held, as its summary says: from the answers'
    usage (`prefix_hit_rate_tokens`: vLLM with --enable-prompt-tokens-details), else from the server's `/metrics`
    (0 where neither says)."""
    for key in ("prefix_hit_rate_tokens", "server_prefix_cache_hit_rate"):
        if summary.get(key) is not None:
            return float(summary[key])
    return 0.0


def load_run_folder(path: Path, setup: dict) -> MeasuredRun:
    """A finished run folder of this harness as a measured run; the requests it finished are its workload."""
    summary = json.loads((path / "summary.json").read_text())
    config = OmegaConf.load(path / "config.yaml")
    table = next((path / f"requests.{ext}" for ext in ("csv", "parquet") if (path / f"requests.{ext}").is_file()),
                 None)
    if table is None:
        raise MeasuredRunError(f"measured run {str(path)!r} has no requests table (requests.csv or .parquet)")
    requests = pd.read_parquet(table) if table.suffix == ".parquet" else pd.read_csv(table)
    finished = requests[requests.status == "finished"].sort_values("arrival_s")
    runner = config.runner.name
    hardware = setup.get("hardware") or (config.runner.get("hardware") if runner == "sim" else None)
    model = setup.get("model") or config.model.name
    if not hardware:
        raise MeasuredRunError(f"measured run {str(path)!r}: say which GPU it ran on (setup hardware=<name from "
                               "conf/hardware/>)")
    specs = [RequestSpec(i, float(t), (), int(o), prompt_len=int(p)) for i, (t, p, o) in
             enumerate(zip(finished.arrival_s - finished.arrival_s.min(), finished.prompt_len,
                           finished.num_output_tokens))]
    if not specs:
        raise MeasuredRunError(f"measured run {str(path)!r} finished no request")
    cached = cached_prompt_share(summary)
    if cached > MAX_CACHED_PROMPT_SHARE:
        raise MeasuredRunError(
            f"measured run {str(path)!r}: the server's prefix cache held {cached:.0%} of its prompt tokens, so its "
            "prefills were shorter than the simulator, which computes every prompt in full, would replay them; "
            "measure with prompts the server has not seen (another workload.seed) or its prefix caching off "
            "(vLLM: --no-enable-prefix-caching)")
    setup = {"endpoint": config.runner.get("endpoint", "completions")} | setup
    check_setup(setup, path)
    metrics = {ours: float(summary[ours]) for ours, _ in METRICS.values() if summary.get(ours) is not None}
    concurrency = config.workload.get("max_concurrency")
    return MeasuredRun(
        name=path.name, source=str(path), hardware=hardware, model=model, requests=specs,
        max_concurrency=int(concurrency) if concurrency else None, metrics=metrics,
        tensor_parallel=int(setup.get("tensor_parallel", config.runner.get("tensor_parallel", 1))),
        max_num_seqs=setup.get("max_num_seqs"), max_num_batched_tokens=setup.get("max_num_batched_tokens"),
        memory_fraction=memory_share(setup, config.kv_cache.memory_fraction),
        served_over_http=runner in ("openai", "sim"),
        setup=setup)
