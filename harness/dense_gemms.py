"""A model's dense GEMMs timed on this device, in each weight format, beside the roofline's dense-GEMM time for the same
step: the one part of the simulator's step time a GPU check can measure apart from any engine.

A decode step of T sequences multiplies a `[T, hidden]` activation by every layer's QKV, output, gate-up and down
weights and the LM head. One layer's weights (436 MB for Llama-3.1-8B in BF16) are several times an H100's or H200's L2,
so timing the same layer's four GEMMs over and over streams them from memory, as a forward pass over the layers does (a
smaller model's layer is cycled through copies of it); the step's time is that layer's times the layers, plus the LM
head. FP8 here is per-tensor scaled (`torch._scaled_mm`, cuBLASLt): the FP8 tensor cores' own rate, where the roofline
gives block-scaled FP8 GEMMs (what FP8 checkpoints ship) `fp8_block_scaled_share` of it.
"""

import math
import time

import numpy as np
import torch

from harness.architecture import Architecture
from harness.layout import FORMAT_BYTES
from harness.model_spec import DTYPE_BYTES, read_model_config
from harness.sim.costmodel import StepShape, build_cost_model

FP8 = torch.float8_e4m3fn
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
# Several times the 50-60 MB L2 of an H100 or H200: a matrix timed alone is cycled through copies this large in all,
# so every pass reads it from memory.
STREAMED_BYTES = 256e6


def layer_weights(config: dict) -> list[tuple[int, int]]:
    """(out, in) of a dense Llama-style layer's four GEMMs: fused QKV, attention output, fused gate-up, down."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    kv_heads = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    return [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden),
            (hidden, inter)]


def _gemm(weight_format: str, shape: tuple[int, int], tokens: int, device: str):
    """A closure computing `[T, in] @ [in, out]` in `weight_format` (inputs in the same format, as FP8 tensor cores
    take them)."""
    out_features, in_features = shape
    x = torch.randn(tokens, in_features, device=device, dtype=torch.bfloat16)  # [T, in]
    w = torch.randn(out_features, in_features, device=device, dtype=torch.bfloat16) / in_features**0.5  # [out, in]
    if weight_format == "bf16":
        return lambda: x @ w.t()
    x8, w8 = x.to(FP8), w.to(FP8)
    one = torch.ones((), device=device)
    # _scaled_mm takes its second matrix column-major: the row-major [out, in] weight, transposed.
    return lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _seconds(fns: list, reps: int, device: str) -> float:
    """Mean seconds of one pass over `fns`, after a warm-up. On a GPU the pass is captured in a CUDA graph and timed
    by CUDA events over `reps` replays, so it is the device's own work: launched one by one, a GEMM of a few tens of
    megabytes takes less time on the GPU than its launch does on the host (and vLLM replays its decode steps as
    graphs too)."""
    for fn in fns:
        fn()
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    begin = time.perf_counter()
    for _ in range(reps):
        for fn in fns:
            fn()
    return (time.perf_counter() - begin) / reps


def decode_shape(tokens: int) -> StepShape:
    """A decode step of `tokens` sequences (one token each, all sampled); its GEMMs do not depend on the context."""
    return StepShape(padded=False, num_tokens=tokens, num_rows=tokens, attention_pairs=tokens, kv_tokens_read=tokens,
                     num_sampled=tokens, decode_pairs=tokens)


def measure(model_cfg, runner_cfg, device: str, formats: list[str], tokens: list[int], reps: int) -> list[dict]:
    """Per format and token count: the step's dense GEMMs measured here, the roofline's time for them with
    `runner_cfg`'s hardware and engine, and the measured rate as a share of the format's datasheet peak."""
    config = read_model_config(model_cfg)
    layer, lm_head = layer_weights(config), (config["vocab_size"], config["hidden_size"])
    rows = []
    for weight_format in formats:
        arch = Architecture.from_config(config, DTYPE_BYTES["bfloat16"], weight_format)
        roofline = build_cost_model(runner_cfg, arch)
        peak = roofline.hardware.peak_flops if weight_format == "bf16" else roofline.hardware.fp8_flops
        layer_bytes = sum(out * inp for out, inp in layer) * FORMAT_BYTES[weight_format]
        # A small model's layer fits in L2: cycle through copies so each pass reads its weights from memory, as a
        # forward pass over all its layers does. On a CPU (the dry run) one copy.
        copies = max(1, math.ceil(STREAMED_BYTES / layer_bytes)) if device == "cuda" else 1
        for t in tokens:
            layer_gemms = [_gemm(weight_format, shape, t, device) for _ in range(copies) for shape in layer]
            layer_s = _seconds(layer_gemms, reps, device) / copies
            head_s = _seconds([_gemm("bf16", lm_head, t, device)], reps, device)  # engines keep the LM head in BF16
            measured = config["num_hidden_layers"] * layer_s + head_s
            shape = decode_shape(t)
            flops = roofline.gemm_flops(shape)[0]
            predicted = float(roofline.dense_gemm_s(shape))
            rows.append({"format": weight_format, "tokens": t, "measured_ms": 1e3 * measured,
                         "roofline_ms": 1e3 * predicted, "roofline_vs_measured": predicted / measured,
                         "measured_tflops": flops / measured / 1e12,
                         "share_of_peak": flops / measured / peak if peak else None,
                         "weight_bytes": arch.dense_weight_bytes_read(),
                         "num_gemms": arch.num_dense_gemms})
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def stream_and_fixed_time(steps: list[tuple[float, int, float]]) -> tuple[float, float]:
    """(bytes a second, seconds a GEMM) that best explain decode steps given as (weight bytes, GEMMs, seconds): a
    step's weights streamed at one rate plus a fixed time for each GEMM it runs. Least squares over each step's error
    as a share of its time, so a 0.6B model's step counts as much as a 70B's. Two steps of different models settle
    both; the fixed time is why a small model's weights stream at less of the bandwidth."""
    seconds = np.array([t for _, _, t in steps], dtype=float)  # [S]
    a = np.array([[weight_bytes, gemms] for weight_bytes, gemms, _ in steps], dtype=float) / seconds[:, None]  # [S, 2]
    per_byte, per_gemm = np.linalg.lstsq(a, np.ones_like(seconds), rcond=None)[0]
    return 1 / per_byte, per_gemm


def decode_fits(step: list[dict], bandwidth: float) -> list[dict]:
    """Per format, from `measure`'s rows of several models: the stream rate and fixed time per GEMM their decode steps
    at the fewest tokens agree with (`stream_and_fixed_time`); none with fewer than two models."""
    fits = []
    for weight_format in dict.fromkeys(row["format"] for row in step):
        rows = [row for row in step if row["format"] == weight_format]
        fewest = min(row["tokens"] for row in rows)
        steps = [(row["weight_bytes"], row["num_gemms"], row["measured_ms"] / 1e3) for row in rows
                 if row["tokens"] == fewest]
        if len(steps) < 2:
            continue
        rate, per_gemm = stream_and_fixed_time(steps)
        fits.append({"format": weight_format, "tokens": fewest, "models": len(steps), "stream_tb_s": rate / 1e12,
                     "share_of_datasheet": rate / bandwidth, "per_gemm_us": 1e6 * per_gemm})
    return fits


def streaming(model_cfg, hardware_bandwidth: float, device: str, formats: list[str], tokens: int,
              reps: int) -> list[dict]:
    """Each of the model's weight matrices alone, at `tokens` rows: the rate it streams its weights at, as a share of
    the datasheet bandwidth. A decode step's GEMMs are bound by it; smaller matrices stream at less of it."""
    config = read_model_config(model_cfg)
    shapes = dict(zip(LAYER_GEMMS, layer_weights(config))) | {"lm_head": (config["vocab_size"], config["hidden_size"])}
    rows = []
    for i, weight_format in enumerate(formats):
        for name, shape in shapes.items():
            if name == "lm_head" and i:
                continue  # engines keep it in BF16: once is enough
            kind = "bf16" if name == "lm_head" else weight_format
            weight_bytes = shape[0] * shape[1] * FORMAT_BYTES[kind]
            # On a CPU (the dry run) one copy: its caches are not what is measured there.
            copies = max(1, int(STREAMED_BYTES // weight_bytes)) if device == "cuda" else 1
            seconds = _seconds([_gemm(kind, shape, tokens, device) for _ in range(copies)], reps, device) / copies
            rows.append({"format": kind, "matrix": name, "out_x_in": f"{shape[0]}x{shape[1]}",
                         "weight_mb": weight_bytes / 1e6, "us": 1e6 * seconds, "tb_s": weight_bytes / seconds / 1e12,
                         "share_of_datasheet": weight_bytes / seconds / hardware_bandwidth})
    return rows
