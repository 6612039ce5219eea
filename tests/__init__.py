"""Runs before any test module or conftest: without a GPU, Triton kernels run on CPU tensors in Triton's
interpreter, which must be chosen before any kernel is defined, that is before `ragged_kernels` is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
