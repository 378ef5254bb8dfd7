#!/usr/bin/env bash
# The packaging stage of CI, after the main suite (.ci/run): installs podman, runc and debootstrap from
# Debian's packages when missing, then runs tests/packaging, which builds the slim images with
# `images/build.sh --local` (hub, user server, runners for Python 3.11 and 3.13 on debootstrap bases), runs
# each of them, and installs the package alone in a fresh venv. Nothing there skips: an image that cannot be
# built fails its tests. The CUDA runners are not built here (images/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y "${missing[@]}" || { apt-get update && apt-get install -y "${missing[@]}"; }
fi
start=$(date +%s)
bash images/build.sh --local  # the tests build again, from podman's layer cache: nothing is built twice
echo "== images built: $(( $(date +%s) - start )) s"
set +e
GPU_OFFLOAD_PACKAGING_TESTS=1 .venv/bin/python -m pytest tests/packaging "$@"
rc=$?
set -e
echo "== packaging stage: $(( $(date +%s) - start )) s"
exit $rc
