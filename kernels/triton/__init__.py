"""Triton kernels for the paged KV cache; ``kernels.triton.ops`` is the entry point."""
