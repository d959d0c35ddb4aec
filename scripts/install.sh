#!/usr/bin/env bash
# Sets up mlxchat in ./.venv: the optimized BLAS on Linux, then the package itself.
# Usage: bash scripts/install.sh [EXTRAS]   e.g. bash scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -s)" = "Linux" ] && command -v apt-get >/dev/null; then
    # MLX's Linux wheel bundles a slow reference BLAS; mlxchat loads OpenBLAS instead when present.
    if ! ldconfig -p | grep -q libopenblas.so.0; then
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null
    fi
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q --upgrade pip
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
.venv/bin/pip install -q -e "$spec"
echo "mlxchat installed in .venv (run .venv/bin/mlxchat --help)"
