"""The engine side every run shares: the replica (queues, clock, the one writer of request state), the paged
KV cache's bookkeeping, the replay loop over an arrival stream, and the runner interface."""
