"""How a transformers config lays a model out: the fields `harness.architecture.Architecture` is read from, under
each family's own names (Mixtral's `num_local_experts`, DeepSeek's `n_routed_experts`, ERNIE 4.5's `moe_num_experts`,
...), what their configs leave unsaid (a two-matrix MLP, a gated attention output), the number formats of weights
and caches, and the layouts the cost model has no time for, refused by name rather than timed as another model.
"""

from harness.model_spec import DTYPE_BYTES

# Bytes a weight takes in each format. fp4 is MXFP4 (OCP Microscaling Formats (MX) Specification v1.0: 4-bit E2M1
# elements sharing one 8-bit E8M0 scale per block of 32), 4.25 bits; fp8's per-block scales (one per 128 x 128, as
# DeepSeek-V3's config gives them) are too few to count.
FORMAT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 4.25 / 8}
QUANTIZATIONS = ("auto", "bf16", "fp8", "fp4")  # model.quantization; auto: the checkpoint's own (its catalogue entry)
KV_DTYPES = ("auto", "bf16", "fp8")  # kv_cache.dtype; auto: the compute dtype
# Model types whose dense MLP is two matrices, up and down, with the activation between (`fc1`/`fc2`, `c_fc`/`c_proj`,
# `dense_h_to_4h`/`dense_4h_to_h` in transformers' modeling code): their configs do not say so.
UNGATED_MLP_MODEL_TYPES = frozenset({"gpt_neox", "gpt_neox_japanese", "phi", "starcoder2", "persimmon", "fuyu", "jais2",
                                     "nanochat", "arcee", "apertus", "apertus1p5", "apertus1p5_text"})
# Model types whose every attention layer gates its output through a second half of the query projection, which
# transformers' modeling code always builds (Qwen3-Next's and Qwen3.5's configs need not say `attn_output_gate`).
GATED_ATTENTION_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


# The kinds of layer `layer_types` may name that the cost model times: attention over the whole context, over the keys
# an indexer picks (DeepSeek-V3.2's and GLM-5's `indexed_attention`), within a window or a chunk, over DeepSeek-V4's
# compressed entries besides its window, and Gated DeltaNet.
COMPRESSED_KINDS = frozenset({"compressed_sparse_attention", "heavily_compressed_attention"})  # DeepSeek-V4's
MODELED_LAYER_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "indexed_attention",
                                 "linear_attention"}) | COMPRESSED_KINDS
# Keys that say a config mixes in state-space (Mamba) or short-convolution layers, whose scan, state and cost the cost
# model does not have: Jamba, Zamba, Bamba, Falcon-H1, Granite 4.0's hybrids, Nemotron-H, LFM2, RecurrentGemma, Mamba.
RECURRENT_LAYER_KEYS = ("mamba_d_state", "ssm_state_size", "state_size", "layers_block_type", "block_types",
                        "conv_L_cache", "attn_layer_period", "attn_layer_indices")
# Gated DeltaNet's own fields: a `linear_attention` layer without them is another kind (MiniMax's lightning
# attention, Kimi's delta attention), whose state and kernels differ.
GATED_DELTANET_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                       "linear_value_head_dim", "linear_conv_kernel_dim")
INDEXER_KEYS = ("index_n_heads", "index_head_dim")  # DeepSeek Sparse Attention's lightning indexer
REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def config_value(config, key: str, default=None):
    """`key` of a config given as a mapping (config.json) or as an object (a transformers config)."""
    value = config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
    return default if value is None else value


def read_layout(config, quantization: str | None = None) -> dict:
    """`Architecture`'s fields from a config mapping or object, but the compute and KV cache dtypes (the run's);
    `quantization` names a format of `FORMAT_BYTES` for the layers' weights (None or `auto`: the checkpoint's own).
    Raises ValueError for a layout the cost model has no time for (`check_layout`)."""
    if hasattr(config, "to_dict"):  # a loaded model's config object: its file's fields, as a mapping is read
        config = config.to_dict()
    check_layout(config)
    num_heads = config_value(config, "num_attention_heads")
    hidden = config_value(config, "hidden_size")
    experts = config_value(config, "num_local_experts", config_value(config, "num_experts", config_value(
        config, "n_routed_experts", config_value(config, "moe_num_experts", 0)))) or 0
    # Doge names its experts' count in its dense variants too; Gemma 4 in its dense ones.
    if config_value(config, "is_moe") is False or config_value(config, "enable_moe_block") is False:
        experts = 0
    layer_types = config_value(config, "layer_types", []) or []
    # Llama 4's chunked layers attend within their 8,192-token chunk: counted as a window that long (at most the
    # same keys, which is all its cache keeps).
    sliding = sum(kind in ("sliding_attention", "chunked_attention") for kind in layer_types)
    if COMPRESSED_KINDS & set(layer_types):  # every DeepSeek-V4 layer attends over its window
        sliding = len(layer_types)
    window = config_value(config, "sliding_window", config_value(config, "attention_chunk_size", 0)) or 0
    num_layers = config_value(config, "num_hidden_layers")
    linear = num_linear_layers(config)
    shared_width = config_value(config, "shared_expert_intermediate_size", 0) if experts else 0
    if experts and config_value(config, "enable_moe_block"):  # Gemma 4 runs its dense MLP beside the experts
        shared_width = config_value(config, "intermediate_size")
    model_type = config_value(config, "model_type", "")
    llama4 = model_type in ("llama4", "llama4_text")
    # Llama 4 names its dense layers' MLP width apart from its experts' (`intermediate_size`); a mixture whose
    # every layer has experts may name none (Qwen3.5's).
    intermediate = config_value(config, "intermediate_size_mlp", config_value(config, "intermediate_size"))
    if intermediate is None and experts and _num_moe_layers(config, num_layers) == num_layers:
        intermediate = 0
    return dict(
        num_layers=num_layers, hidden_size=hidden, intermediate_size=intermediate,
        num_heads=num_heads,
        num_kv_heads=config_value(config, "num_key_value_heads", num_heads),
        # Most configs name head_dim only when it differs from hidden_size / heads.
        head_dim=config_value(config, "head_dim", hidden // num_heads),
        vocab_size=config_value(config, "vocab_size"),
        tie_word_embeddings=bool(config_value(config, "tie_word_embeddings", False)),
        **_weight_formats(config, quantization),
        gated_mlp=model_type not in UNGATED_MLP_MODEL_TYPES,
        num_experts=experts,
        experts_per_token=config_value(config, "num_experts_per_tok", config_value(
            config, "experts_per_token", config_value(config, "moe_k", config_value(config, "top_k_experts", 0))))
        if experts else 0,
        # Mixtral's and gpt-oss's experts are `intermediate_size` wide; Qwen's and DeepSeek's have their own.
        expert_intermediate_size=config_value(config, "moe_intermediate_size", config_value(
            config, "intermediate_size")) if experts else 0,
        # Qwen's one shared expert has a width of its own; Llama 4's, the routed experts' (its config never says).
        num_shared_experts=(1 if shared_width or llama4 else config_value(config, "n_shared_experts", config_value(
            config, "moe_num_shared_experts", 0))) if experts else 0,
        shared_expert_intermediate_size=shared_width,
        num_dense_layers=num_layers - _num_moe_layers(config, num_layers) if experts else 0,
        kv_lora_rank=config_value(config, "kv_lora_rank", 0), q_lora_rank=config_value(config, "q_lora_rank", 0),
        qk_rope_head_dim=config_value(config, "qk_rope_head_dim", 0),
        qk_nope_head_dim=config_value(config, "qk_nope_head_dim", 0),
        v_head_dim=config_value(config, "v_head_dim", 0),
        # Only a layer of `sliding_attention` type slides: Mistral's config names a window every layer honours
        # only in its first release, and says so by giving no layer types.
        sliding_window=window if sliding else 0, num_sliding_layers=sliding if window else 0,
        attention_sinks=model_type == "gpt_oss",
        attention_output_gate=bool(config_value(config, "attn_output_gate",
                                                model_type in GATED_ATTENTION_MODEL_TYPES)),
        num_linear_layers=linear,
        **({"linear_key_heads": config_value(config, "linear_num_key_heads"),
            "linear_value_heads": config_value(config, "linear_num_value_heads"),
            "linear_key_head_dim": config_value(config, "linear_key_head_dim"),
            "linear_value_head_dim": config_value(config, "linear_value_head_dim"),
            "linear_conv_kernel": config_value(config, "linear_conv_kernel_dim"),
            "linear_state_bytes_per_element": DTYPE_BYTES.get(config_value(config, "mamba_ssm_dtype"))}
           if linear else {}),
        **_gemma4_layers(config, layer_types),
        **_indexer(config, layer_types, num_layers),
        **_compressed_attention(config, layer_types),
    )


def _indexer(config, layer_types: list, num_layers: int) -> dict:
    """DeepSeek Sparse Attention's layers and indexer: those `layer_types` names `indexed_attention`, or every layer of
    a config that gives an `index_topk` and no layer types (DeepSeek-V3.2's own file). Empty for any other model."""
    topk = config_value(config, "index_topk", 0)
    if not topk:
        return {}
    if COMPRESSED_KINDS & set(layer_types):  # DeepSeek-V4's indexer picks among compressed entries: its own fields
        return {"index_topk": topk, "index_heads": config_value(config, "index_n_heads"),
                "index_head_dim": config_value(config, "index_head_dim")}
    indexed = sum(kind == "indexed_attention" for kind in layer_types) if layer_types else num_layers
    return {"num_indexed_layers": indexed, "index_topk": topk, "index_heads": config_value(config, "index_n_heads"),
            "index_head_dim": config_value(config, "index_head_dim")}


def _compressed_attention(config, layer_types: list) -> dict:
    """DeepSeek-V4's layers (transformers' DeepseekV4Config: `compress_rates` by layer kind, `o_groups`,
    `o_lora_rank`, `hc_mult`). Every layer attends over its window, a compressed one over its entries besides. Empty
    for any other model."""
    kinds = COMPRESSED_KINDS & set(layer_types)
    if not kinds:
        return {}
    rates = config_value(config, "compress_rates", {}) or {}
    return {"keys_are_values": True, "num_csa_layers": layer_types.count("compressed_sparse_attention"),
            "csa_rate": rates.get("compressed_sparse_attention", 0),
            "num_hca_layers": layer_types.count("heavily_compressed_attention"),
            "hca_rate": rates.get("heavily_compressed_attention", 0),
            "o_groups": config_value(config, "o_groups"), "o_lora_rank": config_value(config, "o_lora_rank"),
            "residual_streams": config_value(config, "hc_mult", 1)}


def _gemma4_layers(config, layer_types: list) -> dict:
    """Gemma 4's layers that differ from the rest: its full-attention layers' heads (`global_head_dim` and, where
    their values are their keys, `num_global_key_value_heads`: transformers' Gemma4TextConfig keeps both in its
    `per_layer_config`), the trailing `num_kv_shared_layers` reading an earlier layer's cache, and its per-layer
    inputs. Empty for any other model."""
    per_layer = config_value(config, "per_layer_config") or {}
    full = [overrides for overrides in per_layer.values() if isinstance(overrides, dict)]
    values_are_keys = bool(config_value(config, "attention_k_eq_v", False))
    if not full and config_value(config, "global_head_dim"):  # the file as it gives them, read by no Gemma 4 class
        global_kv_heads = config_value(config, "num_global_key_value_heads") if values_are_keys else None
        full = [{"head_dim": config_value(config, "global_head_dim")} | (
            {"num_key_value_heads": global_kv_heads} if global_kv_heads else {})]
    fields = {}
    if full:
        fields["full_head_dim"] = full[0].get("head_dim", 0)
        fields["full_kv_heads"] = full[0].get("num_key_value_heads", 0)
        fields["full_values_are_keys"] = values_are_keys
    reusing = config_value(config, "num_kv_shared_layers", 0)
    if reusing and layer_types:
        tail = layer_types[len(layer_types) - reusing:]
        fields["full_layers_reusing_kv"] = sum(kind == "full_attention" for kind in tail)
        fields["sliding_layers_reusing_kv"] = sum(kind == "sliding_attention" for kind in tail)
        if config_value(config, "use_double_wide_mlp", False):
            fields["double_wide_mlp_layers"] = reusing
    if config_value(config, "hidden_size_per_layer_input", 0) and config_value(config, "vocab_size_per_layer_input"):
        fields["per_layer_input_width"] = config_value(config, "hidden_size_per_layer_input")
        fields["per_layer_input_vocab"] = config_value(config, "vocab_size_per_layer_input")
    return fields


def _num_moe_layers(config, num_layers: int) -> int:
    """Layers with a mixture of experts: all but DeepSeek's leading dense ones (`first_k_dense_replace`), or those
    Llama 4 lists (`moe_layers`), or each `interleave_moe_layer_step`-th, or ERNIE 4.5's: each `moe_layer_interval`-th
    layer (counted from one) from `moe_layer_start_index` to `moe_layer_end_index` (-1: the last)."""
    listed = config_value(config, "moe_layers")
    if listed is not None:
        return len(listed)
    step = config_value(config, "interleave_moe_layer_step", 0)
    if step:
        return num_layers // step
    start = config_value(config, "moe_layer_start_index")
    if start is not None:
        end = config_value(config, "moe_layer_end_index", -1)
        end = num_layers - 1 if end == -1 else end
        interval = config_value(config, "moe_layer_interval", 1)
        return sum((i + 1) % interval == 0 for i in range(start, min(end, num_layers - 1) + 1))
    return num_layers - config_value(config, "first_k_dense_replace", 0)


def check_layout(config) -> None:
    """Raises ValueError, naming what it found, for a model whose layers the cost model cannot time or whose config
    lacks the fields a decoder's shape is read from, rather than time it as some other model."""
    model_type = config_value(config, "model_type", "unknown")
    name = f"model type {model_type!r}"
    recurrent = [key for key in RECURRENT_LAYER_KEYS if config_value(config, key) is not None]
    if recurrent:
        raise ValueError(f"{name} has state-space or convolution layers ({recurrent[0]} in its config), which the "
                         "simulator does not model: it times attention (full, sliding, chunked, sparse), multi-head "
                         "latent attention, Gated DeltaNet and mixtures of experts")
    kinds = sorted(set(config_value(config, "layer_types", []) or []) - MODELED_LAYER_KINDS)
    if kinds:
        raise ValueError(f"{name} has layers of a kind the simulator does not model ({', '.join(kinds)}); it models "
                         f"{', '.join(sorted(MODELED_LAYER_KINDS))}")
    if num_linear_layers(config) and any(config_value(config, key) is None for key in GATED_DELTANET_KEYS):
        raise ValueError(f"{name} has linear-attention layers that are not Gated DeltaNet (its config gives no "
                         f"{', '.join(k for k in GATED_DELTANET_KEYS if config_value(config, k) is None)}), which the "
                         "simulator does not model")
    if config_value(config, "index_topk") and any(config_value(config, key) is None for key in INDEXER_KEYS):
        raise ValueError(f"{name} has an attention indexer that is not DeepSeek Sparse Attention's (its config gives "
                         f"no {', '.join(k for k in INDEXER_KEYS if config_value(config, k) is None)}), which the "
                         "simulator does not model")
    missing = [key for key in REQUIRED_KEYS if config_value(config, key) is None]
    experts = any(config_value(config, key) for key in ("num_local_experts", "num_experts", "n_routed_experts",
                                                       "moe_num_experts"))
    if not experts and config_value(config, "intermediate_size") is None:
        missing.append("intermediate_size")
    widths = [key for key in ("intermediate_size", "num_key_value_heads", "head_dim")
              if isinstance(config_value(config, key), (list, tuple))]
    if widths:
        raise ValueError(f"{name} gives each layer its own {widths[0]}, which the simulator does not model: it reads "
                         "one shape for every layer")
    if missing:
        raise ValueError(f"{name}: its config gives no {', '.join(missing)}, which a decoder's shape is read from "
                         "(the names of transformers' Llama-style configs)")


def num_linear_layers(config) -> int:
    """A config's Gated DeltaNet layers: those `layer_types` names so, or where it gives only `full_attention_interval`
    (Qwen3-Next's), every layer but each interval's last."""
    layer_types = config_value(config, "layer_types", []) or []
    if layer_types:
        return sum(kind == "linear_attention" for kind in layer_types)
    interval = config_value(config, "full_attention_interval", 0)
    if interval and config_value(config, "linear_num_value_heads"):
        num_layers = config_value(config, "num_hidden_layers")
        return num_layers - num_layers // interval
    return 0


def _weight_formats(config, quantization: str | None) -> dict:
    """The layers' and the routed experts' weight bytes: `quantization` for all of them, or (auto) the checkpoint's
    own, which may keep attention unquantized (gpt-oss ships only its experts in MXFP4: `modules_to_not_convert`)."""
    if quantization not in (None, "auto"):
        return {"weight_bytes_per_param": FORMAT_BYTES[quantization]}
    fmt = checkpoint_format(config)
    keep = config_value(_quantization_config(config), "modules_to_not_convert", []) or []
    if fmt and any("attn" in module for module in keep):
        return {"expert_bytes_per_param": FORMAT_BYTES[fmt]}
    return {"weight_bytes_per_param": format_bytes(fmt)}


def checkpoint_format(config) -> str | None:
    """The format a checkpoint ships its layers' weights in, from its config's `quantization_config` (DeepSeek-V3's
    `fp8`, gpt-oss's `mxfp4`, NVIDIA's ModelOpt FP8 and NVFP4); None: unquantized, the compute dtype."""
    quantized = _quantization_config(config)
    method = str(config_value(quantized, "quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    if method in ("mxfp4", "nvfp4", "modelopt_fp4"):
        return "fp4"
    if method == "modelopt":
        return {"fp8": "fp8", "nvfp4": "fp4"}.get(str(config_value(quantized, "quant_algo", "")).lower())
    return None


def _quantization_config(config):
    return config_value(config, "quantization_config", {}) or {}


def format_bytes(name: str | None) -> float | None:
    if name in (None, "auto"):
        return None
    return FORMAT_BYTES[name]
