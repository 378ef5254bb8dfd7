#!/usr/bin/env bash
# The real-cluster stage of CI: build and start the cluster (up.sh), run every test marked real_cluster on
# it, and take it down whatever happened. Extra arguments go to pytest. Each stage's time lands in
# $RC_STATE/logs/stages.txt and is printed at the end.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
source "$HERE/env.sh"

started=$SECONDS
bash "$HERE/down.sh" >/dev/null 2>&1  # a cluster left by an interrupted run
if ! bash "$HERE/up.sh"; then
	echo "real cluster did not come up; logs in $RC_LOGS" >&2
	tail -n 40 "$RC_LOGS"/*.log >&2
	bash "$HERE/down.sh"
	exit 1
fi
# RC_TORCH_IMAGE=1 (CI's stage sets it): the torch image on every node too (torch_image.sh: about 4 GB, minutes), so
# the [real] halves that hold torch (issue 27's session survival: preemption, drain, lost donor, idle release,
# move) run; they then fail without it instead of skipping (realorigin.torch_image).
if [ "${RC_TORCH_IMAGE:-0}" = 1 ]; then
	image_started=$SECONDS
	bash "$HERE/torch_image.sh" || echo "torch image not built; the tests that need it fail" >&2
	echo "torch_image $((SECONDS - image_started))s" >>"$RC_LOGS/stages.txt"
fi
# The user-server image on node 1 when this machine built it (CI's packaging stage does, images/ci.sh): the
# queued Metaflow step's [real] half runs in it and skips without it (singleuser_image.sh says why).
if CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/images/containers.conf} podman image exists localhost/jupyter-gpu-offload/singleuser:0.1.0 2>/dev/null; then
	image_started=$SECONDS
	bash "$HERE/singleuser_image.sh" || echo "user-server image not imported; the queued Metaflow step's [real] half skips" >&2
	echo "singleuser_image $((SECONDS - image_started))s" >>"$RC_LOGS/stages.txt"
fi
tests_started=$SECONDS
# The tests that run kubectl (tests/kubectl.py: `kubectl drain` and `kubectl wait`, on the sandbox and on this
# cluster) take the kubectl of the cluster binary built above.
kubectl_cmd="$(printf '%q' "$RC_BIN/cluster") kubectl"
(cd "$REPO" && GPU_OFFLOAD_REAL_CLUSTER=1 GPU_OFFLOAD_KUBECTL=${GPU_OFFLOAD_KUBECTL:-$kubectl_cmd} .venv/bin/python -m pytest -m real_cluster -p no:cacheprovider "$@")
rc=$?
echo "pytest (real_cluster) $((SECONDS - tests_started))s" >>"$RC_LOGS/stages.txt"
echo "== real-cluster stage times"
cat "$RC_LOGS/stages.txt"
bash "$HERE/down.sh"
echo "real-cluster stage total $((SECONDS - started))s"
# pytest's exit 5 (no test collected) is a failure here: the lane exists to run tests.
exit $rc
