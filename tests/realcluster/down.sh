#!/usr/bin/env bash
# Stops the real cluster up.sh started and removes what it made: pods (through the API, so the kubelet
# tears down their containers and network namespaces), then Kueue, the node and the control plane, the
# containers containerd still runs, mounts under $RC_STATE, and the bridge. Keeps $RC_STATE/bin and
# $RC_STATE/images (builds) unless --purge is given.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
source "$HERE/lib.sh"

delete_pods() {
	[ -f "$RC_STATE/pids/kubelet.pid" ] && [ -x "$RC_BIN/cluster" ] || return 0
	kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false --request-timeout=10s \
		>/dev/null 2>&1 || return 0
	for _ in $(seq 30); do
		# (clusters 1-9 have no second node: ctr would wait on its missing socket)
		[ -z "$(ctr_ tasks ls -q 2>/dev/null)${RC_NODE2:+$(CTR_SOCK=$RC_CONTAINERD2_SOCK ctr_ tasks ls -q 2>/dev/null)}" ] &&
			return 0
		sleep 1
	done
}

# kill_containers SOCKET: whatever a node's containerd still runs
kill_containers() {
	local id
	export CTR_SOCK=$1
	if [ -S "$CTR_SOCK" ]; then
		for id in $(ctr_ tasks ls -q 2>/dev/null); do
			ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1
			ctr_ tasks delete -f "$id" >/dev/null 2>&1
		done
		for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1; done
	fi
	unset CTR_SOCK
}

# remove_cgroups ROOT: a node's pod cgroups, deepest first (empty once its containers are gone)
remove_cgroups() {
	[ -z "$1" ] || find /sys/fs/cgroup/*"$1" -depth -type d -exec rmdir {} + 2>/dev/null
	return 0
}

unmount_state() {
	local mount
	# deepest first
	for mount in $(awk -v s="$RC_STATE/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r); do
		umount -l "$mount" 2>/dev/null
	done
}

delete_pods
stop kueue
stop registry
stop gpu-device-plugin
stop gpu-device-plugin-2
stop kubelet
stop kubelet-2
kill_containers "$RC_CONTAINERD_SOCK"
kill_containers "$RC_CONTAINERD2_SOCK"
stop containerd
stop containerd-2
stop node-namespace
stop node2-namespace
stop dns-records
stop dns
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver
stop etcd
unmount_state
ip link del "$RC_BRIDGE" 2>/dev/null
[ "$RC_INDEX" = 0 ] || iptables -t nat -D PREROUTING $(kubernetes_service_rule) 2>/dev/null
if [ -z "$RC_PRIVATE_MOUNTS" ]; then
	rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/gpu-offload-fake-gpu.sock
	rm -f /visibility/apiserver.crt /visibility/apiserver.key; rmdir /visibility 2>/dev/null
fi
# the pods' cgroups of clusters 1-9 and of cluster 0's second node
remove_cgroups "$RC_CGROUP_ROOT"
[ -z "$RC_NODE2" ] || remove_cgroups "$RC_CGROUP2_ROOT"
if [ "${1:-}" = --purge ]; then
	rm -rf "$RC_STATE"
else
	find "$RC_STATE" -mindepth 1 -maxdepth 1 ! -name bin ! -name images -exec rm -rf {} +
fi
echo "real cluster down"
