"""One-shot GPU check of the Triton paged-KV kernels and the engine; writes one JSON file.

    python bench/gpu_check.py [--out bench/results/gpu_check.json]
    python bench/gpu_check.py --cpu-smoke      # same code paths, tiny shapes, TRITON_INTERPRET=1

Parts, each guarded so one failure is recorded and the rest still runs (``report.Report``):
1. correctness of ``write_kv_cache``, decode and prefill against ``kernels.reference`` at the
   Llama-3-8B head layout (32 heads, 8 kv heads, head_dim 128, block_size 16, bfloat16)
   (``kernel_checks``);
2. timing against the torch reference, and decode's effective bandwidth (K/V + query bytes
   read per call / time) against the measured device-to-device copy bandwidth; the target is
   decode at batch 64 × context 2048 reaching 70% of it; a small launch-config sweep too
   (``bandwidth``);
3. a short end-to-end burst of the engine on a llama3-8b-shaped model whose random weights
   ``engine.builder.load_bundle`` makes directly in GPU memory (no 16 GB checkpoint on disk)
   (``engine_burst``). The engine needs pydantic; where it is missing, the part is skipped and
   says so (``make gpu-check-prep``, docs/gpu.md).

Parts 1-2 need only torch and triton (the kernels import nothing else of ours). The JSON is
rewritten after every part, so a run cut short still leaves what it measured.
"""
