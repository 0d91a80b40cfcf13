#!/usr/bin/env bash
# mypy over the `sluice` namespace and the benchmarks (`bench`). The rooms live at the top
# level (codec/, proxy/, ...) and are mapped into `sluice.*` by setuptools, which mypy cannot
# follow through an editable install; a throwaway tree of symlinks gives mypy the installed layout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
TREE="$(mktemp -d)"
trap 'rm -rf "$TREE"' EXIT
mkdir -p "$TREE/sluice"
for f in "$ROOT"/sluice/*.py; do ln -s "$f" "$TREE/sluice/"; done
for room in codec crypto filters proxy spark_audit telemetry_schema transforms; do ln -s "$ROOT/$room" "$TREE/sluice/$room"; done
cd "$ROOT"
MYPYPATH="$TREE" "$VENV/bin/mypy" --no-incremental -p sluice -p bench --config-file "$ROOT/pyproject.toml"
