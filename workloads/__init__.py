"""Workload sources: each turns its input into a time-ordered list of `RequestSpec`."""

from workloads.build import build_workload
from workloads.spec import RequestSpec, Workload, WorkloadError

__all__ = ["RequestSpec", "Workload", "WorkloadError", "build_workload"]
