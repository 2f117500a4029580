"""Attention and KV-cache kernels: a torch reference (CPU) and Triton (CUDA)."""
