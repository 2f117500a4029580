#!/usr/bin/env bash
# Builds .venv-lmeval at the repository root: lm-evaluation-harness in a venv of its own.
# The CPU torch wheel comes from the PyTorch CPU index; where pip is already configured with
# a CPU wheel (a find-links folder, an offline mirror), TORCH_INDEX= (empty) skips that index.
# The rest comes from the configured package index.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${LMEVAL_VENV:-$root/.venv-lmeval}"
python="${PYTHON:-python3.11}"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
torch_index="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
"$venv/bin/pip" install ${torch_index:+--extra-index-url "$torch_index"} \
    -r "$root/bench/lm_eval/requirements.txt"
"$venv/bin/python" -c 'import lm_eval, torch; print("lm_eval ready; torch", torch.__version__)'
