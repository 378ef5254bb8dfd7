#!/usr/bin/env bash
# An image with torch for the real cluster's nodes (bench/bench_realcluster.py --torch): the cluster's Python
# image (Debian's python3 3.11) plus torch 2.13.0 and what `import torch` needs, copied from this checkout's
# .venv (the files pip installed there from the same wheels; no registry is reachable and no second download of
# torch is made). Imported into every node's containerd (node 2's too when the cluster has one), so a session that
# holds torch may be drained, lost or moved from one donor to the other (tests/engine/kube/test_session_survival.py).
# Usage: sudo bash tests/realcluster/torch_image.sh   (the cluster running; a few minutes, about 4 GB)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/images.sh"
IMAGE=localhost/gpuorc/python-torch:3.11
TAR=$RC_IMAGES/python-torch.tar  # RC_IMAGES: clusters that share one build share it too
SITE=$("$REPO/.venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(os.path.realpath(torch.__file__))))')
# torch and its requirements (torch's metadata), triton aside: nothing imports it before a kernel is compiled;
# numpy, as PyTorch's images carry it
PACKAGES="torch torch-2.13.0.dist-info torchgen functorch nvidia cuda sympy mpmath networkx jinja2 markupsafe
filelock fsspec typing_extensions.py setuptools _distutils_hack numpy numpy.libs"

if [ ! -f "$TAR" ]; then
	podman image exists localhost/gpuorc/python:3.11 || podman load -q -i "$RC_IMAGES/python.tar" >/dev/null
	box=$(podman create localhost/gpuorc/python:3.11 true)
	trap 'podman rm -f "$box" >/dev/null' EXIT
	podman cp /dev/null "$box:/tmp/.keep" 2>/dev/null || true
	for package in $PACKAGES; do
		# Debian's python3 reads /usr/local/lib/python3.11/dist-packages; -L: the checkout's venv may link
		podman cp "$(readlink -f "$SITE/$package")" "$box:/usr/local/lib/python3.11/dist-packages/$package"
	done
	podman commit -q "$box" "$IMAGE" >/dev/null
	podman save --format docker-archive -o "$TAR.part" "$IMAGE" >/dev/null && mv "$TAR.part" "$TAR"
	podman rmi -f "$IMAGE" >/dev/null
fi
for sock in "$RC_CONTAINERD_SOCK" ${RC_NODE2:+"$RC_CONTAINERD2_SOCK"}; do
	CTR_SOCK=$sock ctr_ images import "$TAR" >/dev/null
done
echo "$IMAGE on $RC_NODE${RC_NODE2:+ and $RC_NODE2}"
