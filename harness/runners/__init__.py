"""Runners execute a `BatchPlan`: the real one on a transformers model, returning tokens and a duration."""

from harness.runners.base import StepResult

__all__ = ["StepResult"]
