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
		[ -z "$(ctr_ tasks ls -q 2>/dev/null)" ] && return 0
		sleep 1
	done
}

kill_containers() {
	local id
	[ -S "$RC_CONTAINERD_SOCK" ] || return 0
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1
		ctr_ tasks delete -f "$id" >/dev/null 2>&1
	done
	for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1; done
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
stop gpu-device-plugin
stop kubelet
kill_containers
stop containerd
stop node-namespace
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver
stop etcd
unmount_state
ip link del "$RC_BRIDGE" 2>/dev/null
if [ -z "$RC_PRIVATE_MOUNTS" ]; then
	rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/gpu-offload-fake-gpu.sock
	rm -f /visibility/apiserver.crt /visibility/apiserver.key; rmdir /visibility 2>/dev/null
fi
# the pods' cgroups of clusters 1-9 (deepest first; empty once the containers are gone)
[ -z "$RC_CGROUP_ROOT" ] || find /sys/fs/cgroup/*"$RC_CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
if [ "${1:-}" = --purge ]; then
	rm -rf "$RC_STATE"
else
	find "$RC_STATE" -mindepth 1 -maxdepth 1 ! -name bin ! -name images -exec rm -rf {} +
fi
echo "real cluster down"
