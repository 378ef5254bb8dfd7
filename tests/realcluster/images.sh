# The preamble of the scripts that put images on a running cluster's node (registry.sh, singleuser_image.sh,
# torch_image.sh): this cluster's env.sh and lib.sh, the checkout's root (REPO), and podman's configuration
# for this machine (images/containers.conf) unless the caller set one. Sourced after HERE is set.
REPO=$(cd "$HERE/../.." && pwd)
source "$HERE/env.sh"
source "$HERE/lib.sh"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/images/containers.conf}
