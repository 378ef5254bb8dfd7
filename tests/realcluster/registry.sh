#!/usr/bin/env bash
# Images under the registry names outside suites use (KubeSpawner's tests, the Kubernetes Python client's e2e
# tests), served to a running cluster's containerd from a registry on this machine. No registry is reachable
# here, and those suites name `:latest` images, which a kubelet pulls every time (imagePullPolicy Always), so
# importing them into containerd is not enough: containerd's hosts files (up.sh's `config_path`) send pulls
# for docker.io and quay.io to a local registry (Debian's docker-registry) on the pods' bridge.
# The images are stand-ins built here (tests/realcluster/outside/Containerfile.*), saved once under
# $RC_IMAGES/outside. Usage: registry.sh (the cluster running); down.sh stops the registry with the rest.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/images.sh"
RECIPES=$HERE/outside
SAVED=$RC_IMAGES/outside
REGISTRY=$RC_HOST_IP:$RC_REGISTRY_PORT
HUB_BASE=${RC_HUB_BASE:-localhost/jupyter-gpu-offload/k8s-hub:0.1.0}            # images/build.sh --only hub
SINGLEUSER=${RC_SINGLEUSER:-localhost/jupyter-gpu-offload/singleuser:0.1.0}     # images/build.sh --only singleuser
PYTHON_BASE=localhost/gpuorc/python:3.11                                        # up.sh's build_images
# name in the registry (docker.io's library/ and quay.io's paths: one registry serves both) <- recipe
IMAGES="library/busybox:latest=busybox library/python:latest=python library/python:3.12-slim=python
library/nginx:latest=nginx library/nginx:1.15.4=nginx jupyterhub/jupyterhub:latest=hub
jupyterhub/singleuser:latest=singleuser"

build() {  # build RECIPE: the stand-in's podman archive, made once
	local recipe=$1 tar=$SAVED/$1.tar context image=localhost/gpuorc-outside/$1:latest
	[ -f "$tar" ] && return 0
	mkdir -p "$SAVED"
	podman image exists "$PYTHON_BASE" || podman load -q -i "$RC_IMAGES/python.tar" >/dev/null
	context=$(mktemp -d)
	case $recipe in
	busybox) cp "$(command -v busybox)" "$context/busybox" ;;
	singleuser) podman tag "$SINGLEUSER" "$image"; podman save -q --format docker-archive -o "$tar" "$image"; return ;;
	esac
	local base=$PYTHON_BASE
	[ "$recipe" = hub ] && base=$HUB_BASE
	# --network host: apt and npm reach their registries; the host's CA bundle for their TLS
	podman build -q --network host --build-arg "BASE=$base" -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
		-t "$image" -f "$RECIPES/Containerfile.$recipe" "$context" >/dev/null
	podman save -q --format docker-archive -o "$tar.part" "$image" && mv "$tar.part" "$tar"
	rm -rf "$context"
}

serve() {
	mkdir -p "$RC_STATE/registry"
	cat >"$RC_STATE/registry/config.yml" <<YAML
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $RC_STATE/registry/data}, delete: {enabled: true}}
http: {addr: "$REGISTRY"}
YAML
	start registry docker-registry serve "$RC_STATE/registry/config.yml"
	wait_for "registry" 30 curl -sf "http://$REGISTRY/v2/"
	# containerd reads these at each pull (up.sh's config_path), for both nodes of cluster 0
	local certs host server
	for certs in "$RC_STATE/containerd/certs.d" ${RC_NODE2:+"$RC_NODE2_STATE/containerd/certs.d"}; do
		for host in docker.io quay.io; do
			server=https://$host
			[ "$host" = docker.io ] && server=https://registry-1.docker.io
			mkdir -p "$certs/$host"
			printf 'server = "%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' "$server" "$REGISTRY" \
				>"$certs/$host/hosts.toml"
		done
	done
}

push() {
	local pair name recipe
	for pair in $IMAGES; do
		name=${pair%%=*} recipe=${pair#*=}
		build "$recipe"
		podman load -q -i "$SAVED/$recipe.tar" >/dev/null
		podman push -q --tls-verify=false "localhost/gpuorc-outside/$recipe:latest" "docker://$REGISTRY/$name"
	done
}

# The images on every node, as on a node that has run them before: a kubelet still asks the registry for a
# `:latest` image at each start, but no longer waits for its layers (the hub image is about 500 MB; its first
# pull under load outlasted the suite's 90 s wait for the hub pod).
prepull() {
	local pair name host sock certs
	for pair in $IMAGES; do
		name=${pair%%=*} host=docker.io
		case $name in jupyterhub/*) host=quay.io ;; esac
		for sock in "$RC_CONTAINERD_SOCK" ${RC_NODE2:+"$RC_CONTAINERD2_SOCK"}; do
			certs=$(dirname "$sock")/certs.d
			CTR_SOCK=$sock ctr_ images pull --hosts-dir "$certs" "$host/$name" >/dev/null
		done
	done
}

stage serve
stage push
stage prepull
echo "registry at $REGISTRY serves: $IMAGES" | tr '\n' ' '; echo
