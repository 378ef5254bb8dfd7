#!/usr/bin/env bash
# Builds (from Go modules) and starts a real Kubernetes cluster and real Kueue on this machine: embedded etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, two kubelets (two nodes) each with its containerd, runc and the bridge CNI
# plugin, a fake GPU device plugin, and Kueue configured as docs/queueing.md tells an admin to. Everything
# lives under $RC_STATE and the bridge gpuorc0; `down.sh` removes it all. Root is required (containers).
# Usage: up.sh            build, start and wait until the node is Ready and Kueue answers
#        up.sh build      only build the binaries and images
#        RC_STAGES="start_node wait_ready" up.sh   only the stages named (functions below)
# docs/realcluster.md explains the versions and what each stage costs on a cold machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
source "$HERE/pki.sh"
source "$HERE/lib.sh"
# Go as this machine kind installs it, when a non-login shell's PATH lacks it
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin

main() {
	mkdir -p "$RC_BIN" "$RC_LOGS" "$RC_STATE/pids"
	local stages="install_packages build_binaries build_images"
	[ "${1:-}" = build ] || stages="$stages make_pki start_network start_dns start_control_plane start_node start_node2 import_images"
	[ "${1:-}" = build ] || stages="$stages install_kueue wait_ready"
	# RC_STAGES: only these (a developer re-running one step, e.g. RC_STAGES=install_kueue)
	for name in ${RC_STAGES:-$stages}; do stage "$name"; done
	[ "${1:-}" = build ] || echo "real cluster up: KUBECONFIG=$RC_KUBECONFIG"
}

# Debian packages the node needs (installed only when missing, so a second run costs nothing).
install_packages() {
	local missing=() tool package
	for pair in containerd:containerd runc:runc debootstrap:debootstrap podman:podman openssl:openssl curl:curl \
		/usr/lib/cni/bridge:containernetworking-plugins; do
		tool=${pair%%:*} package=${pair#*:}
		if [ "${tool#/}" != "$tool" ]; then [ -e "$tool" ] || missing+=("$package"); continue; fi
		command -v "$tool" >/dev/null || missing+=("$package")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	apt-get install -y "${missing[@]}" >/dev/null || { apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null; }
	command -v go >/dev/null || { echo "up.sh: Go is required to build the cluster (go build)" >&2; return 1; }
}

build_binaries() {
	local version=v1.35.4 ldflags
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
	ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean"
	(cd "$HERE/cluster" && go build -p "${RC_BUILD_JOBS:-2}" -trimpath -ldflags "$ldflags" -o "$RC_BIN/cluster" .)
	(cd "$HERE/cluster" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$RC_BIN/pause" ./pause)
	(cd "$HERE/kueue" && go build -p "${RC_BUILD_JOBS:-2}" -trimpath -ldflags "-s -w" -o "$RC_BIN/kueue" sigs.k8s.io/kueue/cmd/kueue)
}

start_network() {
	# The pods' bridge, made here rather than by the CNI plugin so the API server can listen on its address
	# before the first pod exists.
	if ! ip link show "$RC_BRIDGE" >/dev/null 2>&1; then
		# A fixed MAC: a bridge without one takes its ports' lowest, which changes when the pod whose veth has it
		# is deleted; the other pods' ARP entries for the gateway are then wrong and their new connections to
		# this machine (the API server, the object store) stall 35-68 s until the entries expire.
		ip link add "$RC_BRIDGE" address "02:67:6f:72:63:$(printf %02x "$RC_INDEX")" type bridge
		ip addr add "$RC_HOST_IP/${RC_POD_CIDR#*/}" dev "$RC_BRIDGE"
	fi
	ip link set "$RC_BRIDGE" up
	mkdir -p "$RC_STATE/cni/net.d" "$RC_STATE/cni/ipam"
	# Clusters 1-9 (the Liqo stage) run pods that talk to their API server in-cluster (Liqo's virtual kubelet):
	# no kube-proxy runs, so the kubernetes Service's address is routed to the bridge and turned into the API
	# server's there, the one rule kube-proxy would have made for it (down.sh removes it); the other clusters'
	# bridges (where their API servers listen) are routed too, as a peered cluster's API server is reachable.
	local service_route=""
	if [ "$RC_INDEX" != 0 ]; then
		service_route=', "routes": [{"dst": "'"$RC_SERVICE_CIDR"'"}, {"dst": "10.219.0.0/16"}]'
		iptables -t nat -C PREROUTING $(kubernetes_service_rule) 2>/dev/null ||
			iptables -t nat -I PREROUTING $(kubernetes_service_rule)
	fi
	cat >"$RC_STATE/cni/net.d/10-gpuorc.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "gpuorc", "plugins": [
  {"type": "bridge", "bridge": "$RC_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RC_STATE/cni/ipam", "ranges": [[{"subnet": "$RC_POD_CIDR",
            "rangeStart": "${RC_POD_CIDR%.*}.10", "gateway": "$RC_HOST_IP"}]]$service_route}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CNI
}

# Clusters 1-9 run charts whose pods find each other's Services by name (the hub chart of the Liqo stage): no
# cluster DNS runs here, so dnsmasq on the bridge answers <service>.<namespace>.svc.cluster.local with the
# Service's first ready endpoint (a pod IP: no kube-proxy turns a ClusterIP into one, so a name resolves only
# where the Service's port is its pod's), from records the loop below rewrites from the Endpoints every few
# seconds. Cluster 0 keeps the host's resolver.
start_dns() {
	[ "$RC_INDEX" != 0 ] || return 0
	mkdir -p "$RC_STATE/dns"
	: >"$RC_STATE/dns/services"
	start dns dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
		--listen-address="$RC_HOST_IP" --port=53 --local=/cluster.local/ --hostsdir="$RC_STATE/dns" \
		--pid-file= --user=root
	start dns-records bash -c 'source "$0/env.sh" && source "$0/lib.sh" && service_records_loop' "$HERE"
}

cluster_dns() {
	[ "$RC_INDEX" != 0 ] || return 0
	printf 'clusterDNS: [%s]\nclusterDomain: cluster.local\n' "$RC_HOST_IP"
}

start_control_plane() {
	# Requests of the admin identity (tests and benchmarks) in an audit log: bench/bench_realcluster.py counts
	# a cell's API requests there by its user agent, as the API server served them.
	cat >"$RC_STATE/audit-policy.yaml" <<YAML
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [realcluster-admin]
- level: None
YAML
	start etcd "$RC_BIN/cluster" etcd --data-dir "$RC_STATE/etcd" \
		--listen-client-url "http://127.0.0.1:$RC_ETCD_PORT" --listen-peer-url "http://127.0.0.1:$RC_ETCD_PEER_PORT"
	wait_for "etcd" 60 curl -sf "http://127.0.0.1:$RC_ETCD_PORT/health"
	start kube-apiserver "$RC_BIN/cluster" kube-apiserver \
		--etcd-servers="http://127.0.0.1:$RC_ETCD_PORT" \
		--bind-address="$RC_HOST_IP" --advertise-address="$RC_HOST_IP" --secure-port="$RC_APISERVER_PORT" \
		--service-cluster-ip-range="$RC_SERVICE_CIDR" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
		--client-ca-file="$RC_PKI/ca.crt" \
		--tls-cert-file="$RC_PKI/apiserver.crt" --tls-private-key-file="$RC_PKI/apiserver.key" \
		--kubelet-client-certificate="$RC_PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$RC_PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$RC_PKI/ca.crt" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$RC_PKI/sa.pub" --service-account-signing-key-file="$RC_PKI/sa.key" \
		--requestheader-client-ca-file="$RC_PKI/front-proxy-ca.crt" \
		--requestheader-allowed-names=front-proxy-client \
		--requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--proxy-client-cert-file="$RC_PKI/front-proxy-client.crt" \
		--proxy-client-key-file="$RC_PKI/front-proxy-client.key" \
		--kubelet-preferred-address-types=InternalIP,Hostname \
		--enable-aggregator-routing=true --profiling=false \
		--audit-policy-file="$RC_STATE/audit-policy.yaml" --audit-log-path="$RC_LOGS/audit.log" \
		--audit-log-maxsize=200 --audit-log-maxbackup=1
	# No kube-proxy runs here: webhooks and aggregated APIs are reached through their Services' endpoints.
	wait_for "kube-apiserver" 180 kubectl get --raw /readyz
	start kube-controller-manager "$RC_BIN/cluster" kube-controller-manager \
		--kubeconfig="$RC_STATE/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$RC_STATE/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$RC_STATE/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$RC_KCM_PORT" --leader-elect=false \
		--use-service-account-credentials=true \
		--service-account-private-key-file="$RC_PKI/sa.key" --root-ca-file="$RC_PKI/ca.crt" \
		--cluster-signing-cert-file="$RC_PKI/ca.crt" --cluster-signing-key-file="$RC_PKI/ca.key" \
		--profiling=false
	start kube-scheduler "$RC_BIN/cluster" kube-scheduler \
		--kubeconfig="$RC_STATE/scheduler.kubeconfig" \
		--authentication-kubeconfig="$RC_STATE/scheduler.kubeconfig" \
		--authorization-kubeconfig="$RC_STATE/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$RC_SCHEDULER_PORT" --leader-elect=false --profiling=false
}

# containerd_config DIR SOCKET: a node's containerd, with its root, state and socket under DIR.
containerd_config() {
	cat <<TOML
version = 2
root = "$1/root"
state = "$1/state"
[grpc]
  address = "$2"
[ttrpc]
  address = "$2.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$1/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$RC_PAUSE_IMAGE"
  enable_cdi = false
  # Root here lacks CAP_SYS_RESOURCE (no lowering of oom_score_adj, as the kubelet's own log says): never ask
  # runc for a lower score than containerd's own, or every pod sandbox fails to start.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${RC_SNAPSHOTTER:-overlayfs}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RC_STATE/cni/net.d"
  # Per-registry hosts files, read at each pull: empty (no registry is reachable) unless registry.sh serves
  # images under registry names (KubeSpawner's suite names :latest images, which a kubelet always pulls).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$1/certs.d"
TOML
}

# kubelet_config PORT HEALTHZ_PORT CERT CONTAINERD_SOCKET [CGROUP_ROOT]: a node's kubelet configuration.
kubelet_config() {
	cat <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $RC_HOST_IP
port: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $2
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $RC_PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $RC_PKI/$3-serving.crt
tlsPrivateKeyFile: $RC_PKI/$3-serving.key
containerRuntimeEndpoint: unix://$4
cgroupDriver: cgroupfs
# This host mounts cgroup v1 hierarchies beside a v2 one; the kubelet refuses v1 from 1.35 unless told.
failCgroupV1: false
cgroupRoot: ${5:-/}
cgroupsPerQOS: ${RC_CGROUPS_PER_QOS:-true}
enforceNodeAllocatable: [${RC_ENFORCE_ALLOCATABLE-pods}]
# The images are imported, never pulled: keep the kubelet from collecting them or evicting on a full disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
failSwapOn: false
podCIDR: $RC_POD_CIDR
resolvConf: /etc/resolv.conf
$(cluster_dns)
serializeImagePulls: false
maxPods: 60
YAML
}

start_node() {
	mkdir -p "$RC_STATE/containerd" "$RC_STATE/kubelet" "$RC_HEALTHY"
	containerd_config "$RC_STATE/containerd" "$RC_CONTAINERD_SOCK" >"$RC_STATE/containerd/config.toml"
	[ -z "$RC_PRIVATE_MOUNTS" ] || start_node_namespace node-namespace "$RC_STATE" "$RC_CGROUP_ROOT"
	start containerd $(in_node_namespace) containerd --config "$RC_STATE/containerd/config.toml"
	wait_for "containerd" 60 ctr_ version
	kubelet_config "$RC_KUBELET_PORT" "$RC_KUBELET_HEALTHZ_PORT" kubelet "$RC_CONTAINERD_SOCK" "$RC_CGROUP_ROOT" \
		>"$RC_STATE/kubelet/config.yaml"
	start kubelet $(in_node_namespace) "$RC_BIN/cluster" kubelet --config="$RC_STATE/kubelet/config.yaml" \
		--kubeconfig="$RC_STATE/kubelet.kubeconfig" --root-dir="$RC_STATE/kubelet" \
		--hostname-override="$RC_NODE" --node-ip="$RC_HOST_IP" \
		--cert-dir="$RC_STATE/kubelet/pki"
	wait_for "kubelet" 120 curl -sf "http://127.0.0.1:$RC_KUBELET_HEALTHZ_PORT/healthz"
	# The kubelet serves device plugins at /var/lib/kubelet/device-plugins whatever its --root-dir (a path fixed
	# in its device manager), so the plugin registers there.
	# RC_GPUS=0: a node without GPUs (the Liqo stage's origin, whose GPUs are the donor's)
	[ "$RC_GPUS" = 0 ] || start gpu-device-plugin $(in_node_namespace) "$RC_BIN/cluster" gpu-device-plugin \
		--count="$RC_GPUS" --healthy-file="$RC_HEALTHY/$RC_NODE"
}

# Cluster 0's second node (env.sh): what two machines would keep apart is kept apart here. Its containerd,
# kubelet and device plugin run in a mount namespace of their own (start_node_namespace), its pods' cgroups live
# under their own root, its containerd has its own image store. Same bridge, same address, other ports: the API
# server reaches each kubelet at the port its Node reports.
start_node2() {
	[ -n "$RC_NODE2" ] || return 0
	local dir=$RC_NODE2_STATE ns
	mkdir -p "$dir/containerd" "$dir/kubelet" "$RC_HEALTHY"
	start_node_namespace node2-namespace "$dir" "$RC_CGROUP2_ROOT"
	ns=$(in_namespace_of node2-namespace)
	containerd_config "$dir/containerd" "$RC_CONTAINERD2_SOCK" >"$dir/containerd/config.toml"
	start containerd-2 $ns containerd --config "$dir/containerd/config.toml"
	CTR_SOCK=$RC_CONTAINERD2_SOCK wait_for "containerd of $RC_NODE2" 60 ctr_ version
	kubelet_config "$RC_KUBELET2_PORT" "$RC_KUBELET2_HEALTHZ_PORT" kubelet2 "$RC_CONTAINERD2_SOCK" "$RC_CGROUP2_ROOT" \
		>"$dir/kubelet/config.yaml"
	start kubelet-2 $ns "$RC_BIN/cluster" kubelet --config="$dir/kubelet/config.yaml" \
		--kubeconfig="$RC_STATE/kubelet2.kubeconfig" --root-dir="$dir/kubelet" \
		--hostname-override="$RC_NODE2" --node-ip="$RC_HOST_IP" --cert-dir="$dir/kubelet/pki"
	wait_for "kubelet of $RC_NODE2" 120 curl -sf "http://127.0.0.1:$RC_KUBELET2_HEALTHZ_PORT/healthz"
	start gpu-device-plugin-2 $ns "$RC_BIN/cluster" gpu-device-plugin --count="$RC_GPUS" \
		--healthy-file="$RC_HEALTHY/$RC_NODE2"
}

# start_node_namespace HOLDER DIR CGROUP_ROOT: a mount namespace of a node's own, kept by the process HOLDER,
# where the paths the kubelet and Kueue fix in their code are DIR's: the kubelet's device-plugin directory,
# /var/log/pods (each kubelet's garbage collector deletes the entries of pods it does not know) and Kueue's
# /visibility; and a cgroup root for its pods (clusters 1-9, and cluster 0's second node).
start_node_namespace() {
	local holder=$1 dir=$2 root=$3 hierarchy
	mkdir -p "$dir/device-plugins" "$dir/visibility" "$dir/pod-logs" /var/lib/kubelet/device-plugins /visibility \
		/var/log/pods
	start "$holder" unshare --mount --propagation private sh -c "mount --bind '$dir/device-plugins' \
		/var/lib/kubelet/device-plugins && mount --bind '$dir/visibility' /visibility \
		&& mount --bind '$dir/pod-logs' /var/log/pods && exec sleep infinity"
	wait_for "the node's mount namespace" 20 node_namespace_ready "$holder"
	for hierarchy in /sys/fs/cgroup/*/; do
		[ -d "$hierarchy$root" ] && continue
		mkdir "$hierarchy$root"
		# a v1 cpuset group takes no task until it has CPUs and memory nodes
		if [ -f "$hierarchy/cpuset.cpus" ]; then
			cat "$hierarchy/cpuset.cpus" >"$hierarchy$root/cpuset.cpus"
			cat "$hierarchy/cpuset.mems" >"$hierarchy$root/cpuset.mems"
		fi
	done
}

install_kueue() {
	local rendered=$RC_STATE/kueue/manifests.yaml
	mkdir -p "$RC_STATE/kueue/webhook-certs"
	kubectl kustomize "$(cd "$HERE/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config/default" >"$rendered.upstream"
	python3 "$HERE/kueue_manifests.py" "$rendered.upstream" "$RC_HOST_IP" "$RC_KUEUE_WEBHOOK_PORT" \
		"$RC_KUEUE_VISIBILITY_PORT" $RC_KUEUE_MANAGED >"$rendered"
	kubectl apply --server-side --force-conflicts -f "$rendered" >/dev/null
	python3 "$HERE/kueue_manifests.py" --config "$RC_STATE/kueue/webhook-certs" "$RC_KUEUE_WEBHOOK_PORT" \
		"$RC_KUEUE_VISIBILITY_PORT" "$RC_KUEUE_METRICS_PORT" "$RC_KUEUE_HEALTH_PORT" $RC_KUEUE_MANAGED \
		>"$RC_STATE/kueue/config.yaml"
	# Kueue runs with its own ServiceAccount's rights (the manifests' RBAC), as its Deployment would.
	token_kubeconfig kueue kueue-system kueue-controller-manager
	start_kueue
}

# start_kueue: Kueue's process, once installed; the tests of a Kueue outage stop it and start it again
# (RC_STAGES=start_kueue).
start_kueue() {
	# Kueue's visibility server writes its self-signed certificate to /visibility, a path fixed in its code.
	mkdir -p /visibility
	start kueue $(in_node_namespace) "$RC_BIN/kueue" --config="$RC_STATE/kueue/config.yaml" --kubeconfig="$RC_STATE/kueue.kubeconfig" \
		--zap-log-level=2
	# Kueue keeps its webhook certificate in a Secret and waits until the files in its cert dir match it: in a
	# pod the kubelet mounts the Secret there; for the process, write them once Kueue has made them.
	wait_for "Kueue's webhook certificate" 120 webhook_cert_written
	wait_for "kueue" 180 curl -sf "http://127.0.0.1:$RC_KUEUE_HEALTH_PORT/readyz"
	wait_for "Kueue's webhooks answering" 120 kueue_answers
}

wait_ready() {
	local node
	for node in "$RC_NODE" $RC_NODE2; do
		wait_for "node $node Ready" 120 node_ready "$node"
		[ "$RC_GPUS" = 0 ] || wait_for "nvidia.com/gpu on $node" 60 node_has_gpus "$node"
	done
	wait_for "Kueue's webhooks answering" 120 kueue_answers
	wait_for "Kueue's visibility API" 120 kubectl get --raw /apis/visibility.kueue.x-k8s.io/v1beta2
}

main "$@"
