#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine (Python and the package registries only) and runs
# the whole suite: lint, types, layer contracts, then pytest. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m pip check

# The hub's browser proof (tests/hub_extension) needs Debian's chromium and npm's configurable-http-proxy.
# Installed only when missing, so a second run costs nothing.
if [ ! -x /usr/bin/chromium ]; then
  apt-get update && apt-get install -y chromium
fi
# The metrics proof (tests/hub_extension/test_prometheus.py) scrapes the service with Debian's prometheus.
if [ ! -x /usr/bin/prometheus ]; then
  apt-get install -y prometheus || { apt-get update && apt-get install -y prometheus; }
fi
if [ ! -x .ci/node/node_modules/.bin/configurable-http-proxy ]; then
  npm install --prefix .ci/node --no-audit --no-fund configurable-http-proxy
fi
export PATH="$PWD/.ci/node/node_modules/.bin:$PATH"

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/python .ci/typecheck-tree.py >/dev/null
MYPYPATH=.typecheck .venv/bin/mypy -p gpu_offload
echo "== import-linter"
PYTHONPATH=.typecheck .venv/bin/lint-imports --no-cache
echo "== pytest"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
exit $rc
