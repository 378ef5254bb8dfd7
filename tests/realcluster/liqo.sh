#!/usr/bin/env bash
# Real Liqo between two real clusters on this machine: an origin (cluster 1 of env.sh, a node without GPUs) and
# a donor (cluster 2: fake GPUs, and Kueue managing every namespace, as a donor that runs Kueue for its own
# users often has it), both started by up.sh beside the default cluster 0, which is never touched. Liqo is
# built from its Go module (tests/realcluster/liqo/go.mod), installed from its own chart in that module
# (liqo_manifests.py), with networking off, and its components run as processes; the two clusters are peered
# by liqoctl's own peering code (pkg/liqoctl/peer, through liqo/peer), built from the same module. docs/realcluster.md says what that leaves out and what it costs.
# Root is required.
# Usage: liqo.sh up        build, start both clusters, install Liqo on both, peer them
#        liqo.sh down      stop everything (both clusters' down.sh), keeping the builds
#        liqo.sh test ...  the tests marked real_liqo on the running pair (arguments go to pytest)
#        liqo.sh run ...   down, up, test, down: the Liqo stage in one command
#        liqo.sh skip-labels kueue.x-k8s.io/queue-name   the origin's Liqo keeps these labels off donor pods
#                          from now on ("": none, Liqo's default); the tests of Kueue's label and the hub's
#                          path run in that setting
#        LIQO_STAGES="peer" liqo.sh up   only the stages named (functions below)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
# The pair's builds and the stage's logs (each cluster's state is under its own RC_STATE, from env.sh)
LIQO_STATE=${LIQO_STATE:-/var/tmp/gpu-offload-realcluster-liqo}
ORIGIN=1
DONOR=2
# Origin and donor as Liqo names them (the ForeignCluster of each on the other)
ORIGIN_ID=origin
DONOR_ID=donor
DONOR_GPUS=2   # of the donor's 4 fake GPUs, the ResourceSlice asks for 2
# The labels the origin's Liqo keeps off donor pods (offloading.reflection.skip.labels): none by default, as
# Liqo ships; the test of Kueue's label reflection installs both ways.
LIQO_SKIP_LABELS=${LIQO_SKIP_LABELS:-}
mkdir -p "$LIQO_STATE/bin" "$LIQO_STATE/images" "$LIQO_STATE/logs"

# in_cluster INDEX CMD...: run CMD (a function of this script or of lib.sh) with cluster INDEX's env.sh.
in_cluster() {
	(
		unset RC_STATE RC_NODE RC_GPUS RC_KUEUE_MANAGED
		export RC_INDEX=$1 RC_BIN=$LIQO_STATE/bin RC_IMAGES=$LIQO_STATE/images
		shift
		case $RC_INDEX in
		"$ORIGIN") export RC_NODE=origin RC_GPUS=0 ;;
		"$DONOR") export RC_NODE=donor-gpu RC_KUEUE_MANAGED=all ;;
		esac
		source "$HERE/env.sh"
		source "$HERE/lib.sh"
		"$@"
	)
}

# timed CMD...: run CMD, log its time, return its status (called after `||`, where bash ignores `set -e`, the
# status must be passed on: `liqo.sh run` once exited 0 with a failed test)
timed() {
	local started=$SECONDS rc=0
	echo "== $*"
	"$@" || rc=$?
	echo "$* $((SECONDS - started))s" | tee -a "$LIQO_STATE/logs/stages.txt"
	return $rc
}

up_clusters() {
	in_cluster "$ORIGIN" bash "$HERE/up.sh"
	in_cluster "$DONOR" bash "$HERE/up.sh"
}

build_liqo() {
	local tools
	# the tool block of the module's go.mod
	tools=$(awk '/^tool \(/ {on=1; next} on && /^\)/ {on=0} on {print $1}' "$HERE/liqo/go.mod")
	# One go build for every tool and our peer command: the packages they share are compiled once.
	(cd "$HERE/liqo" && go build -p "${RC_BUILD_JOBS:-2}" -trimpath -ldflags "-s -w" -o "$LIQO_STATE/bin/" $tools ./peer)
}

liqo_version() { (cd "$HERE/liqo" && go list -m -f '{{.Version}}' github.com/liqotech/liqo); }
liqo_chart() { echo "$(cd "$HERE/liqo" && go list -m -f '{{.Dir}}' github.com/liqotech/liqo)/deployments/liqo"; }

# install_liqo ID: Liqo's CRDs and chart on this cluster, its controller manager, webhook and CRD replicator
# as processes with their own ServiceAccounts' tokens (so they have exactly the chart's RBAC).
install_liqo() {
	local id=$1 dir=$RC_STATE/liqo port=$RC_LIQO_PORT_BASE
	mkdir -p "$dir"
	"$REPO/.venv/bin/python" "$HERE/liqo_manifests.py" "$dir" "$(liqo_chart)" "$(liqo_version)" "$id" \
		"https://$RC_HOST_IP:$RC_APISERVER_PORT" "$RC_HOST_IP" "$RC_LIQO_WEBHOOK_PORT" "$RC_POD_CIDR" \
		"$RC_SERVICE_CIDR" "$LIQO_SKIP_LABELS"
	kubectl apply --server-side --force-conflicts -f "$dir/crds.yaml" >/dev/null
	kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
	kubectl apply --server-side --force-conflicts -f "$dir/manifests.yaml" >/dev/null
	token_kubeconfig liqo-webhook liqo liqo-webhook
	token_kubeconfig liqo-controller-manager liqo liqo-controller-manager
	token_kubeconfig liqo-crd-replicator liqo liqo-crd-replicator
	# The webhook writes its certificate to /tmp/k8s-webhook-server, a path fixed in Liqo's code: each
	# cluster's webhook gets its own (a mount namespace of its own inside the node's).
	mkdir -p "$dir/webhook-tmp" /tmp/k8s-webhook-server
	LIQO_PRIVATE_TMP=$dir/webhook-tmp liqo_process webhook liqo-webhook --webhook-port="$RC_LIQO_WEBHOOK_PORT" \
		--metrics-address="127.0.0.1:$port" --health-probe-address="127.0.0.1:$((port + 1))"
	wait_for "Liqo's webhook" 120 curl -sf "http://127.0.0.1:$((port + 1))/readyz"
	liqo_process controller-manager liqo-controller-manager --webhook-port="$((port + 2))" \
		--metrics-address="127.0.0.1:$((port + 3))" --health-probe-address="127.0.0.1:$((port + 4))"
	liqo_process crd-replicator liqo-crd-replicator --metrics-address="127.0.0.1:$((port + 5))"
	wait_for "Liqo's controller manager" 120 curl -sf "http://127.0.0.1:$((port + 4))/readyz"
}

# liqo_process COMPONENT KUBECONFIG_NAME EXTRA_ARGS...: a Liqo component with its Deployment's arguments.
liqo_process() {
	local component=$1 identity=$2 args
	shift 2
	mapfile -t args <"$RC_STATE/liqo/$component.args"
	local private=()
	[ -z "${LIQO_PRIVATE_TMP:-}" ] || private=(unshare --mount --propagation private sh -c \
		'mount --bind "$0" /tmp/k8s-webhook-server && exec "$@"' "$LIQO_PRIVATE_TMP")
	start "liqo-$component" env KUBECONFIG="$RC_STATE/$identity.kubeconfig" POD_NAMESPACE=liqo \
		POD_NAME="liqo-$component" DEPLOYMENT_NAME="liqo-$component" \
		$(in_node_namespace) "${private[@]}" "$LIQO_STATE/bin/$(binary_of "$component")" "${args[@]}" "$@"
}

binary_of() {
	case $1 in
	controller-manager) echo liqo-controller-manager ;;
	*) echo "$1" ;;
	esac
}

restart_webhooks() {
	in_cluster "$ORIGIN" restart_webhook
	in_cluster "$DONOR" restart_webhook
}

restart_webhook() {
	local dir=$RC_STATE/liqo port=$RC_LIQO_PORT_BASE
	stop liqo-webhook
	mkdir -p "$dir/webhook-tmp" /tmp/k8s-webhook-server
	LIQO_PRIVATE_TMP=$dir/webhook-tmp liqo_process webhook liqo-webhook --webhook-port="$RC_LIQO_WEBHOOK_PORT" \
		--metrics-address="127.0.0.1:$port" --health-probe-address="127.0.0.1:$((port + 1))"
	wait_for "Liqo's webhook" 120 curl -sf "http://127.0.0.1:$((port + 1))/readyz"
}

install_both() {
	in_cluster "$ORIGIN" install_liqo "$ORIGIN_ID"
	in_cluster "$DONOR" install_liqo "$DONOR_ID"
}

# Liqo's virtual kubelet runs as Liqo makes it, a Deployment per VirtualNode in the origin, from the image its
# VkOptionsTemplate names (never pulled here): built from our build of it on the Debian base lib.sh makes, and
# imported into both clusters' containerd by up.sh (images/extra).
vk_image() {
	local context image
	image=ghcr.io/liqotech/virtual-kubelet:$(liqo_version)
	context=$(mktemp -d)
	cp "$LIQO_STATE/bin/virtual-kubelet" "$context/"
	printf 'FROM localhost/gpuorc/python:3.11\nCOPY virtual-kubelet /usr/bin/virtual-kubelet\n' >"$context/Containerfile"
	in_cluster "$ORIGIN" build_images   # the Debian base (once per machine)
	podman image exists localhost/gpuorc/python:3.11 || podman load -q -i "$LIQO_STATE/images/python.tar" >/dev/null
	podman build --network none -q -t "$image" "$context" >/dev/null
	mkdir -p "$LIQO_STATE/images/extra"
	# (podman refuses to write over an archive)
	rm -f "$LIQO_STATE/images/extra/virtual-kubelet.tar"
	podman save --format docker-archive -o "$LIQO_STATE/images/extra/virtual-kubelet.tar" "$image" >/dev/null
	rm -rf "$context"
}

# The images of the hub chart (tests/realcluster/test_real_hub_path.py), none pulled from a registry: the project's
# hub, user server and Python 3.11 runner (images/build.sh on the local Debian base, podman's layer cache kept),
# and zero-to-jupyterhub's proxy, configurable-http-proxy from npm on that base with this machine's Node (20: the
# version it requires; Debian 12's is 18), named as z2jh's values name it. The origin gets the hub's, the
# donor the runner (runner pods run there) and the user-server image (a Metaflow step's pod runs there: it
# has the boto3 and pip Metaflow's pod bootstrap needs); each is tagged under the name a pod spec spells
# (docker.io/...).
CHP_VERSION=5.3.0
hub_images() {
	local dir=$LIQO_STATE/images/hub context image
	mkdir -p "$dir"
	CONTAINERS_CONF=$REPO/images/containers.conf bash "$REPO/images/build.sh" --local --only hub singleuser runner
	context=$(mktemp -d)
	(cd "$context" && npm install --silent --no-audit --no-fund --prefix chp "configurable-http-proxy@$CHP_VERSION" >/dev/null)
	cp "$(command -v node)" "$context/node"
	printf '%s\n' 'FROM localhost/gpuorc/python:3.11' 'COPY node /usr/bin/node' 'COPY chp /opt/chp' \
		'RUN ln -s /opt/chp/node_modules/configurable-http-proxy/bin/configurable-http-proxy /usr/local/bin/' \
		'USER 65534' >"$context/Containerfile"
	CONTAINERS_CONF=$REPO/images/containers.conf podman build --network none -q \
		-t "quay.io/jupyterhub/configurable-http-proxy:$CHP_VERSION" "$context" >/dev/null
	rm -rf "$context"
	for image in jupyter-gpu-offload/k8s-hub:0.1.0 jupyter-gpu-offload/singleuser:0.1.0 \
		jupyter-gpu-offload/runner:0.1.0-py3.11; do
		rm -f "$dir/$(echo "${image%%:*}" | tr / -).tar"
		podman save --format docker-archive -o "$dir/$(echo "${image%%:*}" | tr / -).tar" "localhost/$image" >/dev/null
	done
	rm -f "$dir/chp.tar"
	podman save --format docker-archive -o "$dir/chp.tar" "quay.io/jupyterhub/configurable-http-proxy:$CHP_VERSION" >/dev/null
	in_cluster "$ORIGIN" import_hub_images jupyter-gpu-offload-k8s-hub jupyter-gpu-offload-singleuser chp
	in_cluster "$DONOR" import_hub_images jupyter-gpu-offload-runner jupyter-gpu-offload-singleuser
}

# import_hub_images ARCHIVE...: into this cluster's containerd, each jupyter-gpu-offload image also under the
# name the chart and the kernel give it (no registry: docker.io/<name>, never pulled).
import_hub_images() {
	local name archive dir=$LIQO_STATE/images/hub
	for name in "$@"; do
		ctr_ images import "$dir/$name.tar" >/dev/null
	done
	ctr_ images ls -q | grep '^localhost/jupyter-gpu-offload/' | while read -r archive; do
		ctr_ images tag --force "$archive" "docker.io/${archive#localhost/}" >/dev/null
	done
}

peer() {
	local origin_kc donor_kc
	origin_kc=$(in_cluster "$ORIGIN" kubeconfig_path)
	donor_kc=$(in_cluster "$DONOR" kubeconfig_path)
	# liqoctl's peering (pkg/liqoctl/peer) with networking disabled, from liqo/peer
	"$LIQO_STATE/bin/peer" --kubeconfig "$origin_kc" --remote-kubeconfig "$donor_kc" \
		--cpu 4 --memory 8Gi --pods 50 --resource "nvidia.com/gpu=$DONOR_GPUS" --timeout 5m
	in_cluster "$ORIGIN" wait_for "the donor's virtual node Ready" 180 virtual_node_ready
}

kubeconfig_path() { echo "$RC_KUBECONFIG"; }

virtual_node_ready() {
	kubectl get nodes -l liqo.io/type=virtual-node \
		-o 'jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}' | grep -q True
}

# skip_labels LABELS: from now on the origin's Liqo keeps LABELS (comma-separated) off donor pods, as
# `offloading.reflection.skip.labels` at install would have: the VkOptionsTemplate (new virtual nodes), each
# VirtualNode's offloading patch, and their virtual kubelets' pods replaced (each reads its patch at start).
skip_labels() {
	local json namespace name
	json=$(python3 -c 'import json, sys; print(json.dumps([l for l in sys.argv[1].split(",") if l]))' "$1")
	kubectl patch vkoptionstemplate -n liqo virtual-kubelet-default --type merge \
		-p "{\"spec\": {\"labelsNotReflected\": $json}}" >/dev/null
	while read -r namespace name; do
		kubectl patch virtualnode -n "$namespace" "$name" --type merge \
			-p "{\"spec\": {\"offloadingPatch\": {\"labelsNotReflected\": $json}}}" >/dev/null
	done < <(kubectl get virtualnodes -A -o 'jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}')
	kubectl delete pods -A -l offloading.liqo.io/component=virtual-kubelet --wait=true --timeout=60s >/dev/null
	wait_for "the donor's virtual node Ready" 120 virtual_node_ready
}

up() {
	for name in ${LIQO_STAGES:-build_liqo vk_image up_clusters install_both peer hub_images}; do timed "$name"; done
	echo "Liqo pair up: origin KUBECONFIG=$(in_cluster "$ORIGIN" kubeconfig_path)," \
		"donor KUBECONFIG=$(in_cluster "$DONOR" kubeconfig_path)"
}

stop_liqo() {
	local file
	for file in "$RC_STATE"/pids/liqo-*.pid; do
		[ -f "$file" ] && stop "$(basename "$file" .pid)"
	done
	return 0
}

down() {
	in_cluster "$ORIGIN" stop_liqo
	in_cluster "$DONOR" stop_liqo
	in_cluster "$ORIGIN" bash "$HERE/down.sh"
	in_cluster "$DONOR" bash "$HERE/down.sh"
}

pytest_liqo() {
	(cd "$REPO" && GPU_OFFLOAD_REAL_LIQO=1 .venv/bin/python -m pytest -m real_liqo -p no:cacheprovider \
		tests/realcluster "$@")
}

# The tests on the pair as Liqo installs by default, then once more those about Kueue's label with the label
# kept off donor pods (what docs/hub.md tells an admin to set), and the hub's whole path, which needs it.
# A failed pass keeps both clusters' logs and the virtual kubelet's (down.sh removes the clusters' own).
run_tests() {
	local rc=0
	pytest_liqo "$@" || { rc=$?; keep_logs first-pass; }
	in_cluster "$ORIGIN" skip_labels kueue.x-k8s.io/queue-name
	pytest_liqo -k "queue_label or hub_path" "$@" || { rc=$?; keep_logs second-pass; }
	in_cluster "$ORIGIN" skip_labels ""
	return $rc
}

# copy_logs DIR: this cluster's process logs into DIR (a function: env.sh's RC_LOGS is not exported to a child)
copy_logs() { cp -r "$RC_LOGS" "$1"; }

# keep_logs NAME: the logs of both clusters' processes and of the origin's virtual kubelet pods, under
# $LIQO_STATE/logs/failed-<time>-NAME
keep_logs() {
	local dir
	dir=$LIQO_STATE/logs/failed-$(date -u +%Y%m%dT%H%M%S)-$1
	mkdir -p "$dir"
	in_cluster "$ORIGIN" copy_logs "$dir/origin" || true
	in_cluster "$DONOR" copy_logs "$dir/donor" || true
	in_cluster "$ORIGIN" kubectl logs -n "liqo-tenant-$DONOR_ID" -l offloading.liqo.io/component=virtual-kubelet --tail=-1 --prefix \
		>"$dir/virtual-kubelet.log" 2>&1 || true
	echo "logs of the failed $1 kept in $dir"
}

case ${1:-up} in
up) up ;;
down) down ;;
test) shift; run_tests "$@" ;;
skip-labels) in_cluster "$ORIGIN" skip_labels "${2:-}" ;;
run)
	shift
	started=$SECONDS
	down >/dev/null 2>&1 || true
	rc=0
	# up in a process of its own: inside an if, bash would ignore `set -e` in the function and carry on
	if bash "$0" up; then timed run_tests "$@" || rc=$?; else rc=1; fi
	echo "== Liqo stage times"; cat "$LIQO_STATE/logs/stages.txt"
	down
	echo "Liqo stage total $((SECONDS - started))s"
	exit $rc
	;;
*) echo "liqo.sh: unknown command '$1' (up, down, test, run, skip-labels)" >&2; exit 2 ;;
esac
