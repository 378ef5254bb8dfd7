#!/usr/bin/env bash
# The project's user-server image on node 1 (donor-1-gpu), for the queued Metaflow step's [real] half
# (tests/flows/test_queued_run.py): a Metaflow step pod downloads its code package with boto3 and first runs
# `python -m pip install boto3 requests`, which the cluster's plain Debian python3 image cannot do (no boto3, no
# pip, and pods reach no package index). The user-server image has both, as a hub user's steps would.
# Built by images/build.sh --local when podman lacks it (minutes; podman's layer cache is kept), then imported.
# Usage: bash tests/realcluster/singleuser_image.sh   (the cluster running, as root)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/images.sh"
IMAGE=localhost/jupyter-gpu-offload/singleuser:0.1.0
podman image exists "$IMAGE" || bash "$REPO/images/build.sh" --local --only singleuser
# a temporary archive in this cluster's own state: RC_IMAGES may be another cluster's shared build
tar=$RC_STATE/singleuser.tar
trap 'rm -f "$tar"' EXIT
podman save -q --format docker-archive -o "$tar" "$IMAGE" >/dev/null
ctr_ images import "$tar" >/dev/null
echo "$IMAGE on $RC_NODE"
