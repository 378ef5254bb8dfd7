# Addresses, ports and paths of the real cluster, sourced by up.sh, down.sh and the tests' fixture (which
# reads the kubeconfig under $RC_STATE). Everything lives under one state directory and one bridge, so other
# clusters on this machine (the sandbox's bridges, other checkouts) are never touched. Override RC_STATE to
# run a second copy elsewhere; the ports and subnets must then be changed too.
RC_STATE=${RC_STATE:-/var/tmp/gpu-offload-realcluster}
RC_BIN=$RC_STATE/bin
RC_LOGS=$RC_STATE/logs
RC_PKI=$RC_STATE/pki
# The node is the first seeded donor's virtual node (tests/realcluster/realorigin.py).
RC_NODE=${RC_NODE:-donor-1-gpu}
RC_BRIDGE=gpuorc0
RC_HOST_IP=10.219.0.1          # the bridge's address: API server, kubelet and Kueue listen here
RC_POD_CIDR=10.219.0.0/24
RC_SERVICE_CIDR=10.220.0.0/24
RC_ETCD_PORT=26379
RC_ETCD_PEER_PORT=26380
RC_APISERVER_PORT=26443
RC_KUBELET_PORT=26250
RC_KUBELET_HEALTHZ_PORT=26248
RC_KCM_PORT=26257
RC_SCHEDULER_PORT=26259
RC_KUEUE_WEBHOOK_PORT=26444
RC_KUEUE_VISIBILITY_PORT=26482
RC_KUEUE_METRICS_PORT=26480
RC_KUEUE_HEALTH_PORT=26481
RC_GPUS=${RC_GPUS:-8}  # per node; the tests make as many healthy as their donor has
RC_CONTAINERD_SOCK=$RC_STATE/containerd/containerd.sock
RC_KUBECONFIG=$RC_STATE/admin.kubeconfig
# A second node, the second donor's (tests that run pods on two donors): its own kubelet and containerd, in a
# mount namespace of their own (the kubelet's device-plugin directory and /var/log/pods are fixed paths) and
# under a cgroup root of its own (each kubelet removes pod cgroups it does not know).
RC_NODE2=${RC_NODE2:-donor-2-gpu}
RC_NODE2_STATE=$RC_STATE/node2
RC_KUBELET2_PORT=26251
RC_KUBELET2_HEALTHZ_PORT=26249
RC_CONTAINERD2_SOCK=$RC_NODE2_STATE/containerd/containerd.sock
RC_CGROUP2_ROOT=/gpuorc-node2
# How many of a node's fake GPUs are healthy: $RC_HEALTHY/<node> holds a count (the tests set it to their
# seeded donor's GPUs; absent, all RC_GPUS are).
RC_HEALTHY=$RC_STATE/healthy-gpus
