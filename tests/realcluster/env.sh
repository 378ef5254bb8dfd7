# Addresses, ports and paths of a real cluster, sourced by up.sh, down.sh and the tests' fixture (which
# reads the kubeconfig under $RC_STATE). Everything lives under one state directory and one bridge, so other
# clusters on this machine (the sandbox's bridges, other checkouts) are never touched.
#
# RC_INDEX picks the cluster: 0 (the default) is the real-cluster stage's cluster; 1 to 9 are further clusters
# that run beside it at the same time (the Liqo stage's origin and donor, tests/realcluster/liqo.sh). Each
# index derives its own state directory, bridge, subnets, port block and cgroup root; index 0 keeps the
# values it always had.
RC_INDEX=${RC_INDEX:-0}
case $RC_INDEX in [0-9]) ;; *) echo "env.sh: RC_INDEX must be 0-9, not '$RC_INDEX'" >&2; return 1 ;; esac
_rc_suffix=${RC_INDEX#0}
RC_STATE=${RC_STATE:-/var/tmp/gpu-offload-realcluster${_rc_suffix:+-$_rc_suffix}}
RC_BIN=${RC_BIN:-$RC_STATE/bin}
# Clusters started together (liqo.sh) share one build of the binaries and images.
RC_IMAGES=${RC_IMAGES:-$RC_STATE/images}
RC_LOGS=$RC_STATE/logs
RC_PKI=$RC_STATE/pki
# The node of cluster 0 is the first seeded donor's virtual node (tests/realcluster/realorigin.py).
RC_NODE=${RC_NODE:-donor-1-gpu}
RC_BRIDGE=gpuorc$RC_INDEX
RC_HOST_IP=10.219.$RC_INDEX.1          # the bridge's address: API server, kubelet and Kueue listen here
RC_POD_CIDR=10.219.$RC_INDEX.0/24
RC_SERVICE_CIDR=10.220.$RC_INDEX.0/24
# Ports: 26xxx for cluster 0, 27xxx for 1, 28xxx for 2, ... (below Linux's ephemeral range from 32768 up to 5)
_rc_port=$((26000 + RC_INDEX * 1000))
RC_ETCD_PORT=$((_rc_port + 379))
RC_ETCD_PEER_PORT=$((_rc_port + 380))
RC_APISERVER_PORT=$((_rc_port + 443))
RC_KUBELET_PORT=$((_rc_port + 250))
RC_KUBELET_HEALTHZ_PORT=$((_rc_port + 248))
RC_KCM_PORT=$((_rc_port + 257))
RC_SCHEDULER_PORT=$((_rc_port + 259))
RC_KUEUE_WEBHOOK_PORT=$((_rc_port + 444))
RC_KUEUE_VISIBILITY_PORT=$((_rc_port + 482))
RC_KUEUE_METRICS_PORT=$((_rc_port + 480))
RC_KUEUE_HEALTH_PORT=$((_rc_port + 481))
# Liqo's processes (tests/realcluster/liqo.sh)
RC_LIQO_WEBHOOK_PORT=$((_rc_port + 445))
RC_REGISTRY_PORT=$((_rc_port + 500))   # registry.sh: images under the registry names outside suites use
RC_LIQO_PORT_BASE=$((_rc_port + 600))   # 600-699: Liqo's metrics, probes and virtual kubelets
RC_GPUS=${RC_GPUS:-8}  # per node; the tests make as many healthy as their donor has (RC_HEALTHY)
# "all": Kueue manages every namespace (its default; the Liqo stage's donor); empty: only user namespaces
RC_KUEUE_MANAGED=${RC_KUEUE_MANAGED:-}
RC_CONTAINERD_SOCK=$RC_STATE/containerd/containerd.sock
RC_KUBECONFIG=$RC_STATE/admin.kubeconfig
# Clusters 1-9 share the machine with cluster 0, so the node's processes (containerd, kubelet, device plugin,
# Kueue) run in a mount namespace of their own where the paths the kubelet and Kueue fix in their code
# (/var/lib/kubelet/device-plugins, which the kubelet empties on start, and /visibility) are this cluster's
# directories, and the kubelet keeps its pods' cgroups under a root of its own (its housekeeping kills
# processes in pod cgroups it does not know). Cluster 0 keeps the host's paths and the root cgroup.
if [ "$RC_INDEX" = 0 ]; then RC_PRIVATE_MOUNTS=""; RC_CGROUP_ROOT=""; else RC_PRIVATE_MOUNTS=1; RC_CGROUP_ROOT=/gpuorc$RC_INDEX; fi
# Cluster 0 has a second node, the second donor's (tests that run pods on two donors): its own kubelet and
# containerd in a mount namespace of their own (the kubelet's device-plugin directory and /var/log/pods, whose
# entries each kubelet deletes for pods it does not know, are fixed paths), under a cgroup root of its own.
# Another index gets one only when RC_NODE2 names it (a copy of the real-cluster stage beside cluster 0:
# RC_INDEX=3 RC_NODE2=donor-2-gpu run.sh).
if [ "$RC_INDEX" = 0 ]; then RC_NODE2=${RC_NODE2:-donor-2-gpu}; else RC_NODE2=${RC_NODE2:-}; fi
RC_NODE2_STATE=$RC_STATE/node2
RC_KUBELET2_PORT=$((_rc_port + 251))
RC_KUBELET2_HEALTHZ_PORT=$((_rc_port + 249))
RC_CONTAINERD2_SOCK=$RC_NODE2_STATE/containerd/containerd.sock
RC_CGROUP2_ROOT=/gpuorc${_rc_suffix}-node2
# How many of a node's fake GPUs are healthy: $RC_HEALTHY/<node> holds a count (the tests set it to their
# seeded donor's GPUs; absent, all RC_GPUS are).
RC_HEALTHY=$RC_STATE/healthy-gpus
unset _rc_suffix _rc_port
