"""Cost models predict a step's duration from its shape: calibrated on this machine's runner, or a roofline."""

from harness.architecture import Architecture
from harness.sim.costmodel.calibrated import CalibratedCostModel
from harness.sim.costmodel.hardware import get_hardware
from harness.sim.costmodel.roofline import RooflineCostModel
from harness.sim.costmodel.shape import StepShape, step_shape


def build_cost_model(runner_cfg, arch: Architecture) -> RooflineCostModel | CalibratedCostModel:
    """runner=sim: a roofline when `runner.hardware` is named, else the calibrated profile `runner.profile`.
    Raises ValueError naming the key at fault."""
    if runner_cfg.hardware and runner_cfg.profile:
        raise ValueError("runner=sim takes runner.hardware (roofline) or runner.profile (calibrated), not both")
    if runner_cfg.hardware:
        from harness.sim.engine_profile import configured_engine

        hardware = get_hardware(runner_cfg.hardware)
        compute_efficiency = None if runner_cfg.compute_efficiency == "auto" else runner_cfg.compute_efficiency
        return RooflineCostModel(arch, hardware, configured_engine(runner_cfg), compute_efficiency,
                                 runner_cfg.tensor_parallel, runner_cfg.expert_parallel)
    if not runner_cfg.profile:
        raise ValueError("runner=sim needs runner.hardware=<name> or runner.profile=<csv from python -m "
                         "harness.sim.step_profile>")
    try:
        return CalibratedCostModel.load(runner_cfg.profile)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"runner.profile: {e}") from None


__all__ = ["CalibratedCostModel", "RooflineCostModel", "StepShape", "build_cost_model", "step_shape"]
