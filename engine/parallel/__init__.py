"""Tensor parallelism over ``torch.distributed``: the shard a rank holds (``shard``), the
process group and its rendezvous (``group``), the per-step message rank 0 broadcasts
(``messages``), the worker ranks' loop (``worker``) and rank 0's handle on them (``world``)."""
