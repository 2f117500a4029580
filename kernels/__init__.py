"""Attention backends over the paged KV cache (torch on CPU, Triton on CUDA) and the plain
oracle."""
