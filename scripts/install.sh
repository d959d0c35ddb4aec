#!/usr/bin/env bash
# Sets up mlxchat in ./.venv: a Python 3.11+ (found, or fetched with uv), the optimized BLAS on Linux, then the
# package itself. A Mac needs Apple silicon, macOS 14+ and a native arm64 Python (MLX ships no other wheel).
# Usage: bash scripts/install.sh [EXTRAS]   e.g. bash scripts/install.sh test;  PYTHON=/path/to/python to choose.
# Anything that stops it is one line on stderr and exit status 2.
set -euo pipefail
cd "$(dirname "$0")/.."

stop() { echo "install.sh: $*" >&2; exit 2; }

OS="$(uname -s)"
if [ "$OS" = "Darwin" ]; then
    if [ "$(uname -m)" != "arm64" ]; then
        # Under Rosetta uname says x86_64 on an Apple-silicon Mac: the shell itself is translated.
        if [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || true)" = "1" ]; then
            stop "this shell runs under Rosetta (x86_64): MLX needs Apple silicon natively; open a native arm64 terminal and rerun"
        fi
        stop "mlxchat needs a Mac with Apple silicon (M1 or later): MLX has no build for Intel Macs"
    fi
    macos="$(sw_vers -productVersion 2>/dev/null || echo 0)"
    [ "${macos%%.*}" -ge 14 ] 2>/dev/null || stop "MLX needs macOS 14 (Sonoma) or later; this Mac runs macOS $macos"
fi

# "MAJOR.MINOR MACHINE" of an interpreter, or nothing when it does not run (a pyenv shim without that version,
# the Command Line Tools' python3 stub that only opens an install dialog).
describe() { "$1" -c 'import platform, sys; print("%d.%d %s" % (sys.version_info[:2] + (platform.machine(),)))' \
    2>/dev/null </dev/null || true; }
# Whether a description is a Python mlxchat runs on: 3.11+ (sqlite3's error codes), arm64 on a Mac.
usable() {
    local version="${1% *}" machine="${1#* }"
    [ -n "$1" ] || return 1
    [ "${version%%.*}" -eq 3 ] 2>/dev/null && [ "${version#*.}" -ge 11 ] 2>/dev/null || return 1
    [ "$OS" != "Darwin" ] || [ "$machine" = "arm64" ]
}

PY=""; seen=""
for candidate in ${PYTHON:-python3.13 python3.12 python3.11 python3}; do
    command -v "$candidate" >/dev/null || continue
    found="$(describe "$candidate")"
    [ -n "$found" ] && seen="${seen:+$seen, }$candidate is ${found% *} ${found#* }"
    if usable "$found"; then PY="$(command -v "$candidate")"; break; fi
done
if [ -z "$PY" ] && [ -z "${PYTHON:-}" ] && command -v uv >/dev/null; then
    # uv finds a Python it manages or one on the system, and downloads one when there is none.
    PY="$(uv python find '>=3.11' 2>/dev/null || true)"
    if [ -z "$PY" ]; then
        uv python install 3.12 >&2 || stop "uv could not install Python 3.12; install Python 3.11 or later and rerun"
        PY="$(uv python find 3.12 2>/dev/null || true)"
    fi
    usable "$(describe "${PY:-false}")" || PY=""
fi
if [ -z "$PY" ]; then
    need="Python 3.11 or later"; how="install one (e.g. apt install python3.11)"
    [ "$OS" = "Darwin" ] && need="an arm64 Python 3.11 or later" && how="install one with 'brew install python@3.12'"
    stop "mlxchat needs $need (found: ${seen:-none}); $how or uv (curl -LsSf https://astral.sh/uv/install.sh | sh), then rerun"
fi

if [ -e .venv ] && ! usable "$(describe .venv/bin/python)"; then
    # A .venv made by an older or Rosetta Python would fail the same way on every rerun.
    echo "install.sh: rebuilding .venv (its Python: $(describe .venv/bin/python || true); need 3.11+)" >&2
    rm -rf .venv
fi
[ -e .venv ] || "$PY" -m venv .venv
echo "install.sh: Python $(describe .venv/bin/python) in .venv"

if [ "$OS" = "Linux" ] && command -v apt-get >/dev/null; then
    # MLX's Linux wheel bundles a slow reference BLAS; mlxchat loads OpenBLAS instead when present.
    if ! ldconfig -p | grep -q libopenblas.so.0; then
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null
    fi
fi

.venv/bin/pip install -q --upgrade pip
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
echo "install.sh: installing mlxchat$([ -n "${1:-}" ] && echo " with [$1]") and MLX (a few minutes the first time)"
.venv/bin/pip install -q -e "$spec"
echo "mlxchat installed in .venv (run .venv/bin/mlxchat --help)"

# The test extra also brings the coding agents the suite runs against `mlxchat serve` (tests/test_agents.py):
# their current releases from npm, as their users install them, into .venv/agents (nothing global).
AGENTS="@anthropic-ai/claude-code @openai/codex @qwen-code/qwen-code opencode-ai"
case ",${1:-}," in
    *,test,*)
        if command -v npm >/dev/null; then
            echo "install.sh: installing the coding agents' current releases into .venv/agents (npm)"
            npm install --prefix .venv/agents --no-audit --no-fund --loglevel=error $(printf '%s@latest ' $AGENTS) \
                >/dev/null || stop "npm could not install the coding agents ($AGENTS) into .venv/agents"
            npm ls --prefix .venv/agents --depth=0 | tail -n +2
        else
            echo "install.sh: no npm: the coding agents are not installed, and tests/test_agents.py skips" >&2
        fi;;
esac
