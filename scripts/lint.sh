#!/usr/bin/env bash
# Lint with the ruff pinned in the dev extra (`pip install -e .[dev]`), run through the
# interpreter so that whatever `ruff` happens to be on PATH is never used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
"$PY" -m ruff --version >/dev/null 2>&1 || {
    echo "[lint] FAILED: ruff is not installed for $PY; run: bash scripts/test.sh --install-only" >&2
    exit 1
}
echo "[lint] $("$PY" -m ruff --version) check src tests benchmarks examples"
"$PY" -m ruff check src tests benchmarks examples || {
    echo "[lint] FAILED: ruff found problems (fix them, or run: $PY -m ruff check --fix src tests benchmarks examples)" >&2
    exit 1
}
