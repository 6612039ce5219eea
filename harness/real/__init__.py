"""The real runner: a transformers causal LM over the paged KV cache, with our attention swapped in."""
