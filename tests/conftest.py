"""Suite-wide set-up. TRITON_INTERPRET must be set before anything imports triton."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("servedeck", deadline=None, print_blob=True)
settings.load_profile("servedeck")
