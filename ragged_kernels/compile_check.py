"""Compile every kernel for real GPUs on any machine: `python -m ragged_kernels.compile_check`.

The interpreter accepts code the GPU compiler rejects (`break`, small `tl.dot` tiles), so the CPU tests also run
Triton's own compiler for sm_80 and sm_90 with the tile sizes the GPU path uses. Needs TRITON_INTERPRET unset.
"""

import argparse
import json
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ragged_kernels.paged_attention import BLOCK_M, BLOCK_N, ragged_paged_attention_kernel
from ragged_kernels.store_kv import store_kv_kernel

TARGETS = {"sm_80": GPUTarget("cuda", 80, 32), "sm_90": GPUTarget("cuda", 90, 32)}
TRITON_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def attention_source(dtype: str, head_dim: int = 128, page: int = 16, group: int = 4) -> ASTSource:
    t = TRITON_DTYPES[dtype]
    signature = {
        "q_ptr": f"*{t}", "out_ptr": f"*{t}", "k_cache_ptr": f"*{t}", "v_cache_ptr": f"*{t}",
        "cu_seqlens_q_ptr": "*i64", "seq_lens_k_ptr": "*i64", "block_table_ptr": "*i64", "scale": "fp32",
        "q_stride_t": "i32", "q_stride_h": "i32", "out_stride_t": "i32", "out_stride_h": "i32",
        "block_table_stride": "i32",
    }
    constexprs = {
        "NUM_KV_HEADS": 8, "GROUP": group, "HEAD_DIM": head_dim, "BLOCK_D": triton.next_power_of_2(head_dim),
        "PAGE": page, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N,
        "DOT_IN_FP32": dtype == "float32",
    }
    signature |= {name: "constexpr" for name in constexprs}
    return ASTSource(fn=ragged_paged_attention_kernel, signature=signature, constexprs=constexprs)


def store_source(dtype: str, row: int = 8 * 128) -> ASTSource:
    t = TRITON_DTYPES[dtype]
    constexprs = {"ROW": row, "BLOCK": triton.next_power_of_2(row)}
    signature = {"key_ptr": f"*{t}", "value_ptr": f"*{t}", "k_cache_ptr": f"*{t}", "v_cache_ptr": f"*{t}",
                 "slot_mapping_ptr": "*i64", "key_stride": "i32", "value_stride": "i32"}
    signature |= {name: "constexpr" for name in constexprs}
    return ASTSource(fn=store_kv_kernel, signature=signature, constexprs=constexprs)


def sources():
    yield "ragged_paged_attention bf16", attention_source("bfloat16")
    yield "ragged_paged_attention fp16 d64 page1", attention_source("float16", head_dim=64, page=1, group=1)
    yield "ragged_paged_attention fp32", attention_source("float32")
    yield "store_kv bf16", store_source("bfloat16")


def compile_all() -> list[dict]:
    """Compile every kernel for every target: one row per (target, kernel) with its cubin size and compile time."""
    rows = []
    for arch, target in TARGETS.items():
        for name, source in sources():
            start = time.perf_counter()
            compiled = triton.compile(source, target=target)
            rows.append({"target": arch, "kernel": name, "cubin_bytes": len(compiled.asm["cubin"]),
                         "seconds": time.perf_counter() - start})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    rows = compile_all()
    if parser.parse_args().json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(f"{row['target']} {row['kernel']}: {row['cubin_bytes']} bytes of cubin in {row['seconds']:.1f} s")


if __name__ == "__main__":
    main()
