"""The Triton kernels' entry points, as ``kernels.triton_backend`` calls them."""

from kernels.triton.cache_write import write_kv_cache
from kernels.triton.decode import paged_decode_attention
from kernels.triton.prefill import paged_prefill_attention

__all__ = ["paged_decode_attention", "paged_prefill_attention", "write_kv_cache"]
