"""A model's shape, read from its transformers config without loading it (`harness.layout` reads the fields): what
the KV cache, the roofline and the real runner's cache tensors need.

It covers the attention and expert layouts of 2026's open models:
- attention: multi-head or grouped-query (`num_key_value_heads`), multi-head latent attention (DeepSeek-V3/R1:
  `kv_lora_rank`, its cache one latent of `kv_lora_rank + qk_rope_head_dim` per token and layer instead of K and V
  per head), sliding-window layers mixed with full ones (gpt-oss: `layer_types`, `sliding_window`), and attention
  sinks (a learned logit per head: one parameter per head, no bytes or FLOPs worth counting), DeepSeek Sparse
  Attention (DeepSeek-V3.2, GLM-5: `indexed_attention` layers, whose indexer keeps `index_topk` keys a query),
  DeepSeek-V4's compressed attention (a window in every layer and compressed entries besides), chunked attention
  (Llama 4: layers attending within their chunk, counted as a window of its length), a gate on the
  attention's output (Qwen3-Next, Qwen3.5: `attn_output_gate`, the query projection twice as wide), and linear-attention
  layers mixed with full ones (Gated DeltaNet in Qwen3-Next and Qwen3.5: `layer_types` of `linear_attention`, or every
  layer but each `full_attention_interval`-th), which keep a fixed-size state per sequence instead of a cache that
  grows with it; and Gemma 4's heterogeneous layers: full-attention layers with heads of their own size and number
  (`global_head_dim`, `num_global_key_value_heads`), whose values may be their keys' projection (`attention_k_eq_v`),
  trailing layers that attend over an earlier layer's cache instead of keeping one (`num_kv_shared_layers`, their MLP
  twice as wide under `use_double_wide_mlp`), and per-layer input embeddings (`hidden_size_per_layer_input`: a
  table looked up per token, a projection into every layer and a small gated one in each);
- the MLP: dense and gated (gate, up and down, as Llama's and nearly every model's since), dense with only up and
  down (GPT-NeoX, Phi-2, StarCoder2: `harness.layout.UNGATED_MLP_MODEL_TYPES`), or a mixture of experts —
  `num_experts` (Mixtral's `num_local_experts`, DeepSeek's `n_routed_experts`, ERNIE 4.5's `moe_num_experts`) of
  `moe_intermediate_size` (Mixtral and gpt-oss: `intermediate_size`), `experts_per_token` chosen per token, shared
  experts every token uses (DeepSeek's `n_shared_experts` and ERNIE's `moe_num_shared_experts` of the routed width,
  Qwen's one of `shared_expert_intermediate_size`, Llama 4's one), and `num_dense_layers` layers with a dense MLP
  (DeepSeek's leading `first_k_dense_replace`, the layers Llama 4's `moe_layers` or ERNIE's `moe_layer_*` leave out);
- the number formats: the layers' linear weights in bf16, fp8 or fp4 (`model.quantization`; embeddings and the LM
  head stay in the compute dtype, as FP8 and FP4 checkpoints keep them), the KV cache in its own (`kv_cache.dtype`).
"""

from dataclasses import dataclass

from harness.layout import format_bytes, read_layout

INDEX_QUANT_BLOCK = 128  # elements of a DeepSeek Sparse Attention index key sharing one FP32 scale


@dataclass(frozen=True)
class Architecture:
    num_layers: int
    hidden_size: int
    intermediate_size: int  # a dense layer's MLP width (0 in a mixture whose every layer has experts)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    bytes_per_param: float  # the compute dtype's: embeddings, LM head, activations
    tie_word_embeddings: bool = False
    weight_bytes_per_param: float | None = None  # the layers' linear weights; None: the compute dtype's
    expert_bytes_per_param: float | None = None  # the routed experts'; None: as the other layer weights
    kv_bytes_per_element: float | None = None  # the KV cache's; None: the compute dtype's
    gated_mlp: bool = True  # a dense MLP of gate, up and down; False: up and down only
    # A mixture of experts; 0 experts: a dense MLP in every layer.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen's one shared expert's width; 0: shared experts are routed-wide
    num_dense_layers: int = 0  # layers with a dense MLP in a mixture of experts (where they are does not matter)
    # Multi-head latent attention; kv_lora_rank 0: K and V per KV head.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention in some layers; 0 layers: every layer attends to the whole context.
    sliding_window: int = 0
    num_sliding_layers: int = 0
    attention_sinks: bool = False
    attention_output_gate: bool = False  # a sigmoid gate on the attention's output, computed by the query projection
    # Gated DeltaNet layers (0: none): heads and head sizes of their keys (and queries) and values, the causal
    # convolution's width, and the bytes of an element of their recurrent state (its own dtype, fp32 in Qwen3.5).
    num_linear_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_bytes_per_element: float | None = None
    # Gemma 4: the full-attention layers' own head size and KV heads (0: as the others'), their values computed by
    # the key projection; layers reading an earlier layer's cache (no K and V projections, no cache of their own), of
    # each kind; layers whose MLP is twice `intermediate_size`; and the per-layer inputs' width and vocabulary.
    full_head_dim: int = 0
    full_kv_heads: int = 0
    full_values_are_keys: bool = False
    full_layers_reusing_kv: int = 0
    sliding_layers_reusing_kv: int = 0
    double_wide_mlp_layers: int = 0
    per_layer_input_width: int = 0
    per_layer_input_vocab: int = 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): layers whose lightning indexer scores every cached token with
    # `index_heads` heads of `index_head_dim` and keeps `index_topk` of them for each query to attend to.
    num_indexed_layers: int = 0
    index_topk: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    # DeepSeek-V4's attention: one KV head whose keys are its values (one cached tensor), a window of the last
    # `sliding_window` tokens in every layer, and in compressed layers one entry per `csa_rate` tokens picked by an
    # indexer over compressed keys (the `index_*` fields: CSA) or one per `hca_rate` tokens read whole (HCA); queries
    # through a low-rank query latent (`q_lora_rank`), outputs through `o_groups` groups of rank `o_lora_rank`, and a
    # residual stream `residual_streams` times the hidden state (mHC), mixed before and after each block.
    keys_are_values: bool = False
    num_csa_layers: int = 0
    csa_rate: int = 0
    num_hca_layers: int = 0
    hca_rate: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0
    residual_streams: int = 1

    @classmethod
    def from_config(cls, config, bytes_per_param: float, quantization: str | None = None,
                    kv_dtype: str | None = None) -> "Architecture":
        """From a config mapping or object (`harness.layout.read_layout`); `quantization` and `kv_dtype` name formats
        of `FORMAT_BYTES` (None or `auto`: the checkpoint's own, the compute dtype)."""
        return cls(bytes_per_param=bytes_per_param, kv_bytes_per_element=format_bytes(kv_dtype),
                   **read_layout(config, quantization))

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def weight_format_bytes(self) -> float:
        return self.weight_bytes_per_param or self.bytes_per_param

    @property
    def expert_format_bytes(self) -> float:
        return self.expert_bytes_per_param or self.weight_format_bytes

    @property
    def routed_expert_params(self) -> int:
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def attention_params(self) -> int:
        if self.latent_attention:
            h, heads = self.hidden_size, self.num_heads
            q_dim = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            q = h * self.q_lora_rank + self.q_lora_rank * q_dim if self.q_lora_rank else h * q_dim
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * heads * (
                self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + heads * self.v_head_dim * h
        return self._attention_params(self.head_dim, self.num_kv_heads, 2)

    @property
    def compressed_attention_params(self) -> int:
        """A DeepSeek-V4 layer's attention: the query's latent and its heads, the one K=V projection, the grouped
        low-rank output (each of `o_groups` groups of heads to `o_lora_rank`, then all to the hidden state), a sink per
        head, and the mixing of the residual streams into and out of the block and its MLP (mHC: `(2 + n) n` weights
        per element of the n streams, twice)."""
        h, heads, width = self.hidden_size, self.num_heads, self.num_heads * self.head_dim
        attention = h * self.q_lora_rank + self.q_lora_rank * width + h * self.head_dim + \
            width * self.o_lora_rank + self.o_groups * self.o_lora_rank * h + heads
        n = self.residual_streams
        return attention + 2 * (2 + n) * n * n * h

    @property
    def compressor_params(self) -> int:
        """Every compressed layer's compressor, over all of them: a projection of the hidden state to the entry and one
        to its gate (CSA's twice as wide: overlapping windows), and CSA's indexer, which compresses keys of its own
        the same way and projects its queries from the query latent and its heads' weights from the hidden state."""
        h, d = self.hidden_size, self.head_dim
        indexer = 2 * h * 2 * self.index_head_dim + self.q_lora_rank * self.index_heads * self.index_head_dim + \
            h * self.index_heads
        return self.num_csa_layers * (2 * h * 2 * d + indexer) + self.num_hca_layers * 2 * h * d

    @property
    def full_attention_params(self) -> int:
        """A full-attention layer's weights, where they differ from the others' (Gemma 4's)."""
        if not (self.full_head_dim or self.full_kv_heads):
            return self.attention_params
        return self._attention_params(self.full_head_dim or self.head_dim, self.full_kv_heads or self.num_kv_heads,
                                      1 if self.full_values_are_keys else 2)

    def _attention_params(self, head_dim: int, kv_heads: int, kv_projections: int) -> int:
        q_out, kv_out = self.num_heads * head_dim, kv_heads * head_dim
        sinks = self.num_heads if self.attention_sinks else 0
        gate = q_out if self.attention_output_gate else 0
        return self.hidden_size * (q_out + gate + kv_projections * kv_out) + q_out * self.hidden_size + sinks

    @property
    def mixer_params(self) -> int:
        """Every layer's attention or linear-attention weights; a layer reading another's cache has no K and V
        projections."""
        if self.keys_are_values:
            return self.num_layers * self.compressed_attention_params + self.compressor_params
        if self.latent_attention or not (self.full_attention_params != self.attention_params
                                         or self.full_layers_reusing_kv or self.sliding_layers_reusing_kv):
            return (self.num_layers - self.num_linear_layers) * self.attention_params + \
                self.num_linear_layers * self.linear_attention_params + self.num_indexed_layers * self.indexer_params
        full_kv = self.full_attention_params - self._attention_params(
            self.full_head_dim or self.head_dim, self.full_kv_heads or self.num_kv_heads, 0)
        sliding_kv = self.attention_params - self._attention_params(self.head_dim, self.num_kv_heads, 0)
        return (self.num_sliding_layers * self.attention_params + self.num_full_layers * self.full_attention_params
                - self.full_layers_reusing_kv * full_kv - self.sliding_layers_reusing_kv * sliding_kv
                + self.num_linear_layers * self.linear_attention_params + self.num_indexed_layers * self.indexer_params)

    @property
    def indexer_params(self) -> int:
        """An indexed layer's lightning indexer: its queries from the query latent (or the hidden state), its one key
        and its heads' weights from the hidden state, and the key's norm."""
        queries = (self.q_lora_rank or self.hidden_size) * self.index_heads * self.index_head_dim
        return queries + self.hidden_size * (self.index_head_dim + self.index_heads) + 2 * self.index_head_dim

    @property
    def index_key_bytes(self) -> float:
        """An indexed layer's cached index key of a token: FP8 with an FP32 scale for every 128 elements, as vLLM's and
        SGLang's DeepSeek-V3.2 caches keep it (ModelTC/lightllm's Deepseek3_2MemoryManager: float8_e4m3fn keys,
        float32 scales, `index_quant_block_size` 128), whatever the latent's dtype."""
        return self.index_head_dim * (1 + 4 / INDEX_QUANT_BLOCK)

    @property
    def indexed_latent_bytes_per_token(self) -> float:
        """What the indexed layers' attention would read of a token it did not pick: its K and V (or latent)."""
        return self.num_indexed_layers * self.full_kv_width * self.kv_element_bytes

    def index_flops_per_pair(self) -> float:
        """The indexer's FLOPs for one query-key pair, over all its heads: a dot product each (their weighted sum and
        ReLU aside)."""
        return 2 * self.index_heads * self.index_head_dim

    @property
    def per_layer_input_params(self) -> int:
        """Gemma 4's per-layer inputs multiplied per token: the hidden state's projection into every layer's input,
        and in each layer the gate into that width and the projection back (the table they are looked up in, as the
        input embedding, is read a row per token)."""
        width = self.per_layer_input_width
        return self.hidden_size * self.num_layers * width + self.num_layers * 2 * self.hidden_size * width

    @property
    def per_layer_input_table_params(self) -> int:
        return self.per_layer_input_vocab * self.num_layers * self.per_layer_input_width

    @property
    def linear_key_width(self) -> int:
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_width(self) -> int:
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_width(self) -> int:
        """Channels of a Gated DeltaNet layer's causal convolution: its queries, keys and values."""
        return 2 * self.linear_key_width + self.linear_value_width

    @property
    def linear_attention_params(self) -> int:
        """A Gated DeltaNet layer's weights: the input projection to queries, keys, values and the output gate and
        to each value head's decay and write strength, the convolution, the output projection, and per head its
        decay's scale and bias (the gated norm's weight, one head wide, aside)."""
        h, heads = self.hidden_size, self.linear_value_heads
        inputs = h * (self.linear_conv_width + self.linear_value_width + 2 * heads)
        return inputs + self.linear_conv_width * self.linear_conv_kernel + self.linear_value_width * h + 2 * heads

    @property
    def linear_state_bytes(self) -> float:
        """One sequence's state in every Gated DeltaNet layer: a key-by-value matrix per value head (in the state's
        dtype) and the convolution's last inputs (in the compute dtype). It is the same size however long the
        sequence."""
        if not self.num_linear_layers:
            return 0.0
        state_bytes = self.linear_state_bytes_per_element or self.bytes_per_param
        recurrent = self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * state_bytes
        conv = self.linear_conv_width * (self.linear_conv_kernel - 1) * self.bytes_per_param
        return self.num_linear_layers * (recurrent + conv)

    @property
    def num_mlp_matrices(self) -> int:
        """A dense MLP's weight matrices, each hidden x intermediate: gate, up and down, or up and down. It is also the
        MLP's activations per unit of width that the activation kernel reads and writes (gate and up read, their
        product written; or up read, its activation written)."""
        return 3 if self.gated_mlp else 2

    @property
    def mlp_params(self) -> int:
        """A dense layer's MLP."""
        return self.num_mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def shared_intermediate_size(self) -> int:
        """The width of the MLP every token of a mixture's layer passes through beside its routed experts."""
        return self.shared_expert_intermediate_size or self.num_shared_experts * self.expert_intermediate_size

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def num_dense_gemms(self) -> int:
        """GEMM kernels a forward pass runs outside the routed experts, each with a fixed time of its own on a GPU
        (`Hardware.gemm_fixed_s`): a layer's fused QKV and output projections (MLA's five: the fused query and latent
        down-projections, the query up-projection, the two absorbed latent ones and the output; a Gated DeltaNet
        layer's three: two input projections and the output), its fused gate-up and down projections (a mixture's
        router and, where it has them, its shared experts'), Gemma 4's per-layer input projections (one into all
        layers, two in each), and the LM head."""
        # DeepSeek-V4's five (the query's latent and heads, the K=V projection, the grouped output's two) and its
        # residual streams' mixing before the attention and the MLP.
        attention = 5 if self.latent_attention else 7 if self.keys_are_values else 2
        mixers = (self.num_layers - self.num_linear_layers) * attention + 3 * self.num_linear_layers
        moe_layer = 1 + (2 if self.shared_intermediate_size else 0)
        mlps = (self.num_layers - self.num_moe_layers) * 2 + self.num_moe_layers * moe_layer
        per_layer_inputs = 2 * self.num_layers + 1 if self.per_layer_input_width else 0
        indexers = 2 * self.num_indexed_layers  # the query projection, and the key and heads' weights fused
        # DeepSeek-V4's compressors (entry and gate fused) and CSA's indexer (its own compressor, queries, weights).
        indexers += self.num_hca_layers + 4 * self.num_csa_layers
        return mixers + mlps + per_layer_inputs + indexers + 1

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts else 0

    @property
    def num_full_layers(self) -> int:
        """Layers attending to the whole context."""
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers

    def experts_touched(self, num_tokens):
        """Distinct routed experts a layer reads for `num_tokens` tokens, each routed to `experts_per_token` of
        `num_experts` (uniform routing, the load-balancing loss's aim): E (1 - (1 - k/E)^T). Works on arrays."""
        if not self.num_experts:
            return 0.0
        return self.num_experts * (1 - (1 - self.experts_per_token / self.num_experts) ** num_tokens)

    def _layers_params(self, experts_per_moe_layer: int) -> int:
        """The layers' weights with this many routed experts counted in each MoE layer."""
        dense = self.num_layers - self.num_moe_layers
        moe = self.expert_params * experts_per_moe_layer + 3 * self.hidden_size * self.shared_intermediate_size + \
            self.router_params
        wide = self.double_wide_mlp_layers * self.num_mlp_matrices * self.hidden_size * self.intermediate_size
        return self.mixer_params + dense * self.mlp_params + self.num_moe_layers * moe + wide + \
            self.per_layer_input_params

    @property
    def layer_params(self) -> int:
        """Every weight of the layers, each expert included: what memory holds."""
        return self._layers_params(self.num_experts)

    @property
    def active_layer_params(self) -> int:
        """The layers' weights one token multiplies: in a mixture, its `experts_per_token` experts and the shared
        ones, not all of them."""
        return self._layers_params(self.experts_per_token)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Every parameter, as a model card counts them (embeddings and, unless tied, the LM head included)."""
        return self.layer_params + (1 if self.tie_word_embeddings else 2) * self.embedding_params + \
            self.per_layer_input_table_params

    @property
    def num_active_params(self) -> int:
        """Parameters a token multiplies: its layers' share and the LM head (the input embedding is a lookup). Model
        cards round this figure and some count the input embedding too (a mixture's `-A22B`)."""
        return self.active_layer_params + self.embedding_params

    @property
    def weight_bytes(self) -> float:
        """The weights' memory: the layers in their formats, the embeddings in the compute dtype."""
        embeddings = (1 if self.tie_word_embeddings else 2) * self.embedding_params + self.per_layer_input_table_params
        return self.dense_weight_bytes_read() + self.routed_expert_params * self.expert_format_bytes + (
            embeddings - self.embedding_params) * self.bytes_per_param

    def dense_weight_bytes_read(self) -> float:
        """What every forward pass streams whatever its tokens: the layers but for their routed experts, and the LM
        head (the input embedding is looked up, a few rows per token, never read whole)."""
        layers = self.layer_params - self.routed_expert_params
        return layers * self.weight_format_bytes + self.embedding_params * self.bytes_per_param

    def expert_bytes_read(self, num_tokens):
        """The routed experts a forward pass over `num_tokens` tokens reads, every layer. Works on arrays."""
        return self.num_moe_layers * self.experts_touched(num_tokens) * self.expert_params * self.expert_format_bytes

    def weight_bytes_read(self, num_tokens):
        return self.dense_weight_bytes_read() + self.expert_bytes_read(num_tokens)

    @property
    def kv_element_bytes(self) -> float:
        return self.kv_bytes_per_element or self.bytes_per_param

    @property
    def kv_width(self) -> int:
        """Elements cached per token and layer: the latent and its rope part, or K and V of every KV head."""
        if self.latent_attention:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return (1 if self.keys_are_values else 2) * self.num_kv_heads * self.head_dim

    @property
    def full_kv_width(self) -> int:
        """`kv_width` of a full-attention layer, where its heads differ (Gemma 4's)."""
        if self.latent_attention or not (self.full_head_dim or self.full_kv_heads):
            return self.kv_width
        return 2 * (self.full_kv_heads or self.num_kv_heads) * (self.full_head_dim or self.head_dim)

    @property
    def kv_bytes_per_token(self) -> float:
        """A token's cache across the layers attending to the whole context that keep one. A sliding-window layer
        keeps at most `sliding_window` tokens of each sequence (vLLM's hybrid cache manager frees the rest), a few MB
        per sequence whatever its length, which the per-token figure leaves out."""
        return (self.num_full_layers - self.full_layers_reusing_kv) * self.full_kv_width * self.kv_element_bytes + \
            self.num_indexed_layers * self.index_key_bytes + self.compressed_bytes_per_token

    @property
    def sliding_kv_bytes_per_token(self) -> float:
        """A token's cache across the sliding-window layers that keep one: what an engine that sizes a pool of
        their own per token (SGLang's) sets beside `kv_bytes_per_token`."""
        return (self.num_sliding_layers - self.sliding_layers_reusing_kv) * self.kv_width * self.kv_element_bytes

    @property
    def compressed_bytes_per_token(self) -> float:
        """DeepSeek-V4's compressed entries, per token of context: a CSA layer's entry and its index key every
        `csa_rate` tokens, an HCA layer's entry every `hca_rate`."""
        if not self.keys_are_values:
            return 0.0
        entry = self.kv_width * self.kv_element_bytes
        csa = self.num_csa_layers * (entry + self.index_key_bytes) / self.csa_rate if self.num_csa_layers else 0.0
        hca = self.num_hca_layers * entry / self.hca_rate if self.num_hca_layers else 0.0
        return csa + hca

    @property
    def kv_reread_bytes_per_token(self) -> float:
        """What the full-attention layers reading an earlier layer's cache read of a cached token, beside its owner."""
        return self.full_layers_reusing_kv * self.full_kv_width * self.kv_element_bytes

    def activation_bytes_per_token(self, tensor_parallel: int = 1) -> float:
        """What the memory-bound kernels between a layer's GEMMs read and write per token, each GPU, all layers: two
        residual adds fused with an RMSNorm (each reads the hidden state and the residual and writes both: 8 x
        hidden; DeepSeek-V4's mHC reads and writes each of its residual streams), rotary embedding on the queries and
        keys (read and written), the attention's output (written), and
        the gated activation (reads gate and up, writes their product: 3 x the MLP width a token passes through, its
        routed and shared experts' in a mixture; an ungated MLP's activation reads up and writes the result: 2 x). A
        Gated DeltaNet layer has no rotary embedding: its convolution reads and writes its queries, keys and values,
        and its gated norm reads the output and the gate and writes their product. The hidden state is whole on every
        GPU under tensor parallelism; the heads and the MLP width are split. A GEMM's own activations stay out: a
        compute-bound GEMM hides them."""
        if self.latent_attention:
            q = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            k = self.qk_rope_head_dim  # rotary runs on the latent's rope part
            out = self.num_heads * self.v_head_dim
        else:
            q, k = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            out = q
        dense = self.num_layers - self.num_moe_layers
        moe_width = self.experts_per_token * self.expert_intermediate_size + self.shared_intermediate_size
        mlp = self.num_mlp_matrices * (dense + self.double_wide_mlp_layers) * self.intermediate_size + \
            3 * self.num_moe_layers * moe_width
        mixers = (self.num_layers - self.num_linear_layers) * (2 * (q + k) + out) + \
            self.num_linear_layers * (2 * self.linear_conv_width + 3 * self.linear_value_width)
        split = mixers + mlp
        residual = self.num_layers * 8 * self.hidden_size * self.residual_streams
        return self.bytes_per_param * (residual + split / tensor_parallel)

    def quantized_inputs_per_token(self, tensor_parallel: int = 1) -> tuple[float, float]:
        """Elements of the linear layers' inputs each GPU quantizes per token over all layers, as (those outside the
        routed experts, those into them): a GEMM on FP8 or FP4 tensor cores takes its activations in its weights'
        format, which a kernel before it writes from the compute dtype (vLLM's and SGLang's per-token-group FP8
        quantization). The attention's and the MLP's inputs are the hidden state, whole on every GPU; the output and
        down projections' inputs are split by tensor parallelism. MLA quantizes the hidden state once for its fused
        query and KV latent projections (twice where it has no query latent), then both latents; a mixture quantizes a
        token's hidden state once for its routed experts, each expert's down projection input, and its shared
        experts' inputs apart. A Gated DeltaNet layer quantizes the hidden state for its input projection and its
        gated output for the output projection."""
        n = tensor_parallel
        if self.latent_attention:
            attention = 2 * self.hidden_size if not self.q_lora_rank else self.hidden_size + self.q_lora_rank
            attention += self.kv_lora_rank + self.num_heads * self.v_head_dim / n
        else:
            attention = self.hidden_size + self.num_heads * self.head_dim / n
        dense_layers = self.num_layers - self.num_moe_layers
        shared = self.hidden_size + self.shared_intermediate_size / n if self.shared_intermediate_size else 0.0
        mixers = (self.num_layers - self.num_linear_layers) * attention + \
            self.num_linear_layers * (self.hidden_size + self.linear_value_width / n)
        outside = mixers + dense_layers * (self.hidden_size + self.intermediate_size / n) + self.num_moe_layers * shared
        routed = self.num_moe_layers * (self.hidden_size + self.experts_per_token * self.expert_intermediate_size / n)
        return outside, routed

    def kv_shards(self, tensor_parallel: int) -> int:
        """How many ways N GPUs split the cache: by KV head, as far as the heads go (fewer heads than GPUs are
        replicated); a latent cache is one head, held whole by every GPU (vLLM's MLA with tensor parallelism)."""
        return 1 if self.latent_attention else min(tensor_parallel, self.num_kv_heads)

    def attention_flops_per_pair(self, decode: bool) -> float:
        """FLOPs of one query-key pair across the heads of one layer. MLA decodes in its absorbed form (queries
        projected into the latent: QK over latent + rope, PV over the latent) and prefills in its expanded one
        (K and V decompressed per head), as vLLM and SGLang run it."""
        if not self.latent_attention:
            return 4 * self.num_heads * self.head_dim  # QK^T and PV
        if decode:
            return 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
