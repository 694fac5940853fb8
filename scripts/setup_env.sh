#!/usr/bin/env bash
# Create .venv and install dynlm into it (editable, with the dev extra).
#
# On a machine without an NVIDIA GPU the CPU build of torch is installed first, so
# that the torch range in pyproject.toml is already satisfied and pip does not pull
# a multi-GB CUDA build. Re-running is cheap: a stamp keyed by pyproject.toml's
# hash skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# Where the CPU wheels of torch live for machines that do not have one on local disk.
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.dynlm-installed"
want=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] GPU found: torch comes from pyproject's range (CUDA build)"
  else
    # A CPU wheel on local disk (pip's find-links) wins; else the CPU index.
    local_cpu=""
    for d in ${PIP_FIND_LINKS:-} $($PIP config get global.find-links 2>/dev/null); do
      ls "$d"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1 && local_cpu=yes
    done
    if [ -n "$local_cpu" ]; then
      echo "[setup] no GPU: installing torch==$TORCH_VERSION (CPU build, local wheel)"
      $PIP install -q --no-compile "torch==$TORCH_VERSION"
    else
      echo "[setup] no GPU: installing torch==$TORCH_VERSION from the CPU wheel index"
      $PIP install -q --no-compile "torch==$TORCH_VERSION" --index-url "$TORCH_CPU_INDEX"
    fi
  fi
fi
$PIP install -q --no-compile -e ".[dev]"
# pip compiles each installed file in one process (~45 s of this script on 2 cores); compileall
# does it on every core. Compiled files matter: a machine that sets PYTHONDONTWRITEBYTECODE=1
# (this one does) would otherwise recompile torch and Ray in every process it starts. A file
# that does not compile (a package's Python-2 test data) is skipped, as pip skips it.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
echo "$want" > "$stamp"
