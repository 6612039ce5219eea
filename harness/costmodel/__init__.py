"""Cost models predict a step's duration from its shape: calibrated on this machine's runner, or a roofline."""

from harness.costmodel.calibrated import CalibratedCostModel
from harness.costmodel.roofline import RooflineCostModel
from harness.costmodel.shape import StepShape, step_shape

__all__ = ["CalibratedCostModel", "RooflineCostModel", "StepShape", "step_shape"]
