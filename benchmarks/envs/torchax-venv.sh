#!/usr/bin/env bash
# Recipe: a virtual environment with torchax's main branch on jax 0.10.2 and torch 2.13.0 (CPU), plus
# transformers 5.24, for benchmarks/hf_step.py's torchax side (--torchax-python). Idempotent.
#
# Why the main branch: torchax 0.0.13, the release on PyPI, does not import with torch 2.13 (its table
# names aten.prod's overload dim_Dimname, which torch 2.13 no longer has); the fix is on its main branch
# (commit b2d44f0 was used). This machine reaches package registries only, so the source comes from a
# snapshot of github.com/google/torchax that you pass in: a checkout, or a (bare) git directory whose
# HEAD is taken.
#
# Usage: benchmarks/envs/torchax-venv.sh SNAPSHOT [VENV]
#        VENV defaults to $VENV, else ${TMPDIR:-/tmp}/torchax/venv; PYTHON picks the interpreter (3.11+).
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 SNAPSHOT [VENV]  (SNAPSHOT: a checkout or a git directory of google/torchax)" >&2
  exit 2
fi
SNAPSHOT="$1"
VENV="${2:-${VENV:-${TMPDIR:-/tmp}/torchax/venv}}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if [ -f "$SNAPSHOT/pyproject.toml" ] && [ -d "$SNAPSHOT/torchax" ]; then
  SRC="$SNAPSHOT"
  COMMIT="$(git -C "$SNAPSHOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
elif git --git-dir "$SNAPSHOT" rev-parse --verify -q HEAD >/dev/null; then
  SRC="$WORK/torchax"
  mkdir -p "$SRC"
  git --git-dir "$SNAPSHOT" archive HEAD | tar -x -C "$SRC"
  COMMIT="$(git --git-dir "$SNAPSHOT" rev-parse --short HEAD)"
else
  echo "$SNAPSHOT is neither a torchax checkout (pyproject.toml, torchax/) nor a git directory" >&2
  exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
# torch is pinned as scripts/setup pins it (the CPU build where the index provides it); jax 0.10.2 is the
# last release for Python 3.11 and the one the rest of the benchmarks use.
"${PIP[@]}" "torch==2.13.0" "jax==0.10.2" "jaxlib==0.10.2" "transformers==5.24.0"
# torchax declares no dependencies of its own (jax and torch are above).
"${PIP[@]}" --no-deps --force-reinstall "$SRC"

JAX_PLATFORMS=cpu "$VENV/bin/python" - "$COMMIT" <<'PY'
import sys

import jax
import torch
import torchax

with torchax.default_env():
    value = (torch.ones(3, device="jax") + 1).sum().item()
assert value == 6.0, value
print(f"torchax {torchax.__version__} (snapshot {sys.argv[1]}), jax {jax.__version__}, torch {torch.__version__}: ready")
PY
echo "python: $VENV/bin/python"
