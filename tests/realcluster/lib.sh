# Helpers of up.sh and down.sh: timed stages, processes started and stopped by their pid files, waits,
# clients of this cluster, and the images pods run. Sourced after env.sh.

RC_PAUSE_IMAGE=localhost/gpuorc/pause:1
# Tests name the stock image python:3.11-slim; here it is Debian's python3 (3.11), built below.
RC_PYTHON_IMAGE=docker.io/library/python:3.11-slim

# stage FUNC: run a step of up.sh and record how long it took (docs/realcluster.md quotes these).
stage() {
	local started=$SECONDS
	echo "== $1"
	"$@"
	echo "$1 $((SECONDS - started))s" | tee -a "$RC_LOGS/stages.txt"
}

# start NAME CMD...: run CMD in its own session, logging to $RC_LOGS/NAME.log; down.sh stops the group.
start() {
	local name=$1
	shift
	if [ -f "$RC_STATE/pids/$name.pid" ] && kill -0 "$(cat "$RC_STATE/pids/$name.pid")" 2>/dev/null; then
		echo "$name already running"
		return 0
	fi
	setsid "$@" >"$RC_LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$RC_STATE/pids/$name.pid"
}

# wait_for WHAT SECONDS CMD...: retry CMD until it succeeds; on time-out print the last log lines and fail.
wait_for() {
	local what=$1 limit=$2 deadline
	shift 2
	deadline=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			echo "$what: not ready after ${limit}s; last log lines:" >&2
			tail -n 30 "$RC_LOGS"/*.log >&2 || true
			return 1
		fi
		sleep 1
	done
}

# in_node_namespace: the command prefix that runs a node process in the cluster's own mount namespace (none for
# cluster 0, which uses the host's).
in_node_namespace() {
	[ -z "$RC_PRIVATE_MOUNTS" ] || in_namespace_of node-namespace
}

# The DNAT rule that stands for kube-proxy's for the kubernetes Service (clusters 1-9, up.sh's start_network).
kubernetes_service_rule() {
	echo "-i $RC_BRIDGE -d ${RC_SERVICE_CIDR%.*}.1/32 -p tcp --dport 443 -j DNAT --to-destination $RC_HOST_IP:$RC_APISERVER_PORT"
}

# in_namespace_of HOLDER: the command prefix that runs a process in the mount namespace HOLDER keeps.
in_namespace_of() {
	echo nsenter "--mount=/proc/$(cat "$RC_STATE/pids/$1.pid")/ns/mnt" --
}

# node_namespace_ready HOLDER
node_namespace_ready() {
	$(in_namespace_of "$1") mountpoint -q /var/log/pods
}

kubectl() { KUBECONFIG=$RC_KUBECONFIG "$RC_BIN/cluster" kubectl "$@"; }
# ctr_ talks to node 1's containerd; CTR_SOCK=$RC_CONTAINERD2_SOCK ctr_ ... to node 2's.
ctr_() { ctr --address "${CTR_SOCK:-$RC_CONTAINERD_SOCK}" --namespace k8s.io "$@"; }

# node_ready NODE
node_ready() {
	[ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# node_has_gpus NODE
node_has_gpus() {
	[ "$(kubectl get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" = "$RC_GPUS" ]
}

# Kueue's validating webhook answers a dry-run create (a ResourceFlavor with an invalid label key is refused
# by the webhook or the schema; either way the API server reached a decision, not a connection error).
kueue_answers() {
	kubectl create --dry-run=server -f - <<'YAML'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: up-probe}
YAML
}

# The Secret's certificate, key and CA as files in Kueue's cert dir (fails until Kueue has filled the Secret).
webhook_cert_written() {
	local key value dir=$RC_STATE/kueue/webhook-certs
	for key in tls.crt tls.key ca.crt; do
		value=$(kubectl get secret -n kueue-system kueue-webhook-server-cert -o "jsonpath={.data.${key//./\\.}}")
		[ -n "$value" ] || return 1
		echo "$value" | base64 -d >"$dir/$key.new" && mv "$dir/$key.new" "$dir/$key"
	done
	chmod 600 "$dir/tls.key"
}

# token_kubeconfig NAME NAMESPACE SERVICEACCOUNT: a kubeconfig with a day-long token of that ServiceAccount.
token_kubeconfig() {
	local token
	token=$(kubectl create token "$3" -n "$2" --duration=24h)
	sed -e '/client-certificate:/d' -e "s|client-key:.*|token: $token|" "$RC_KUBECONFIG" >"$RC_STATE/$1.kubeconfig"
	chmod 600 "$RC_STATE/$1.kubeconfig"
}

# Images are built once into $RC_IMAGES (a fresh machine builds them: no registry is reachable).
build_images() {
	local images=$RC_IMAGES root
	mkdir -p "$images"
	if [ ! -f "$images/pause.tar" ]; then
		root=$(mktemp -d)
		cp "$RC_BIN/pause" "$root/pause"
		tar -C "$root" -cf - . | podman import --change 'ENTRYPOINT ["/pause"]' - "$RC_PAUSE_IMAGE" >/dev/null 2>>"$RC_LOGS/images.log"
		podman save --format docker-archive -o "$images/pause.tar" "$RC_PAUSE_IMAGE" >/dev/null 2>>"$RC_LOGS/images.log"
		rm -rf "$root"
	fi
	if [ ! -f "$images/python.tar" ]; then
		root=$(mktemp -d)
		# The mirror apt already uses on this machine.
		debootstrap --variant=minbase --include=python3 bookworm "$root" \
			"$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)" >"$RC_LOGS/debootstrap.log" 2>&1
		rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
		tar -C "$root" -cf - . | podman import --change 'CMD ["python3"]' - localhost/gpuorc/python:3.11 >/dev/null 2>>"$RC_LOGS/images.log"
		podman save --format docker-archive -o "$images/python.tar" localhost/gpuorc/python:3.11 >/dev/null 2>>"$RC_LOGS/images.log"
		rm -rf "$root"
	fi
}

# import_images: into each node's containerd (each node has its own image store, as on separate machines)
import_images() {
	local tar sock
	for sock in "$RC_CONTAINERD_SOCK" ${RC_NODE2:+"$RC_CONTAINERD2_SOCK"}; do
		CTR_SOCK=$sock ctr_ images import "$RC_IMAGES/pause.tar" >/dev/null
		CTR_SOCK=$sock ctr_ images import "$RC_IMAGES/python.tar" >/dev/null
		CTR_SOCK=$sock ctr_ images tag --force localhost/gpuorc/python:3.11 "$RC_PYTHON_IMAGE" >/dev/null
		# Images another stage built (podman save archives dropped into $RC_IMAGES/extra/).
		for tar in "$RC_IMAGES/extra"/*.tar; do
			[ -f "$tar" ] && CTR_SOCK=$sock ctr_ images import "$tar" >/dev/null
		done
	done
	return 0
}

# stop NAME [SIGNAL]: stop the process group started by `start NAME`, waiting up to 20 s.
stop() {
	local file=$RC_STATE/pids/$1.pid pid
	[ -f "$file" ] || return 0
	pid=$(cat "$file")
	if kill -0 "$pid" 2>/dev/null; then
		kill -"${2:-TERM}" -- "-$pid" 2>/dev/null || true
		for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
		kill -KILL -- "-$pid" 2>/dev/null || true
	fi
	rm -f "$file"
}

# service_records_loop: the records up.sh's dnsmasq serves, "<endpoint IP> <service>.<namespace>.svc.cluster.local",
# rewritten from the ready Endpoints every second while the cluster runs (dnsmasq re-reads its hosts folder on
# change): kube-proxy follows a change about as fast, and the hub must reach its own managed service through its
# Service within 10 s of starting it. The kubernetes Service by its ClusterIP, which up.sh's DNAT rule serves
# (its endpoint's port is not 443).
service_records_loop() {
	local records=$RC_STATE/dns/services new=$RC_STATE/dns-services.new   # (dnsmasq reads every file in dns/)
	while sleep 1; do
		kubectl get endpoints -A --request-timeout=5s -o 'jsonpath={range .items[*]}{.subsets[0].addresses[0].ip} {.metadata.name}.{.metadata.namespace}.svc.cluster.local{"\n"}{end}' \
			2>/dev/null | awk -v api="${RC_SERVICE_CIDR%.*}.1" 'NF == 2 && $2 !~ /^kubernetes\.default\./
				END {print api, "kubernetes.default.svc.cluster.local"}' >"$new" || continue
		cmp -s "$new" "$records" || mv "$new" "$records"
	done
}
