#!/usr/bin/env bash
# Install everything the course needs on a fresh Debian machine with Python 3.11:
# Debian packages (chromium for the browser tests, bubblewrap for the grading sandbox, capsh
# from libcap2-bin for the container-mode tests),
# then torch (the pinned CPU build first, so nothing pulls CUDA wheels), then the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends chromium bubblewrap libcap2-bin fonts-dejavu-core >/dev/null
fi
# The torch pin of pyproject.toml (its one place), installed first.
TORCH=$(sed -n 's/^ *"\(torch==[^"]*\)".*/\1/p' pyproject.toml)
$PY -m pip install -q --disable-pip-version-check "$TORCH"
$PY -m pip install -q --disable-pip-version-check -r requirements.txt
