#!/usr/bin/env bash
# Builds the project's images with podman, from the recipes in images/ and the names, bases and versions in
# src/gpu_offload/images.json (the one place they are written).
#
#   images/build.sh                      the slim images on their published bases (hub, user server, runners)
#   images/build.sh --cuda               also the CUDA runners (torch, a few GB each)
#   images/build.sh --local              on local Debian bases made with debootstrap (no registry needed):
#                                        bookworm (Python 3.11) and trixie (Python 3.13), one per suite, shared
#   images/build.sh --only runner ...    only these roles (hub, singleuser, runner, runner-cuda)
#   images/build.sh --registry R         tag as R/<name> too, ready for `podman push`
#
# The package is built into one wheel that every image installs. pip inside the builds reuses this host's pip
# cache and trusts its CA bundle (both mounted for the build only). podman runs with images/containers.conf.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$HERE")"
PY=${PYTHON:-python3}
[ -x "$REPO/.venv/bin/python" ] && PY=${PYTHON:-$REPO/.venv/bin/python}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
CACHE=${GPU_OFFLOAD_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-offload/images}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}

local_base=0; cuda=0; registry=""; roles=()
while [ $# -gt 0 ]; do
  case "$1" in
    --local) local_base=1 ;;
    --cuda) cuda=1 ;;
    --registry) registry="${2%/}"; shift ;;
    --only) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do roles+=("$1"); shift; done; continue ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "images/build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ ${#roles[@]} -eq 0 ]; then
  roles=(hub singleuser runner)
  [ $cuda = 1 ] && roles+=(runner-cuda)
fi

# role image recipe base debian python cloudpickle torch jupyterhub packages, one line per image to build
plan=$("$PY" - "$REPO/src/gpu_offload/images.json" "$local_base" "${roles[@]}" <<'EOF'
import json, sys
manifest, local, roles = json.load(open(sys.argv[1])), sys.argv[2] == "1", sys.argv[3:]
known = {entry["role"] for entry in manifest["images"]}
unknown = sorted(set(roles) - known)
if unknown:
    sys.exit(f"images/build.sh: no role {', '.join(unknown)}; the roles are {', '.join(sorted(known))}")
packages = "|".join(manifest["notebook_packages"])
for e in manifest["images"]:
    if e["role"] in roles and (e["debian"] or not local):
        print(e["role"], e["image"], e["recipe"], e["base"], e["debian"] or "-", e["python"] or "-",
              e["cloudpickle"] or "-", e["torch"] or "-", e.get("jupyterhub") or "-",
              packages if e["recipe"] in ("runner", "singleuser") else "-")
EOF
)

stamp() { date +%s; }
took() { echo "$(( $(stamp) - $1 )) s"; }

# The package's wheel, once, in the build context every recipe mounts.
context="$REPO/images/.build"
rm -rf "$context" && mkdir -p "$context/wheels"
t=$(stamp)
# a fixed timestamp makes the same source the same wheel, so podman's layer cache holds across builds
SOURCE_DATE_EPOCH=315532800 "$PY" -m pip wheel -q --no-deps --wheel-dir "$context/wheels" "$REPO"
wheel_sha=$(cat "$context"/wheels/*.whl | sha256sum | cut -c1-16)
cp "$HERE/pip-install.sh" "$context/"  # the install step every recipe shares
echo "== wheel: $(ls "$context/wheels") ($(took "$t"))"

# A local Debian base: debootstrap (cached as a tarball), then `podman import` with Python on PATH in a venv,
# as the published python images have it (pip installs there without touching Debian's own packages).
debian_base() {
  local suite=$1 tar="$CACHE/debian-$suite.tar" image="localhost/gpu-offload-base:$suite"
  # an imported base whose tarball is gone (a cleaned cache) is still the base: debootstrap only without both
  if [ ! -f "$tar" ] && podman image exists "$image"; then
    echo "$image"
    return
  fi
  if [ ! -f "$tar" ]; then
    command -v debootstrap >/dev/null || { echo "images/build.sh: --local needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
    local root t; root=$(mktemp -d); t=$(stamp)
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd "$suite" "$root" "$MIRROR" >"$root.log" 2>&1 \
      || { tail -20 "$root.log" >&2; echo "images/build.sh: debootstrap $suite from $MIRROR failed (log above)" >&2; exit 1; }
    chroot "$root" python3 -m venv /opt/python
    # apt's lists and caches, docs and translations: nothing an image runs needs them
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
           "$root"/usr/share/locale/* "$root"/usr/share/info/*
    mkdir -p "$CACHE"
    tar -C "$root" --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -cf "$tar.part" . && mv "$tar.part" "$tar"
    rm -rf "$root" "$root.log"
    echo "== debootstrap $suite: $(du -h "$tar" | cut -f1) ($(took "$t"))" >&2
  fi
  if ! podman image exists "$image" || [ "$tar" -nt "$CACHE/.imported-$suite" ]; then
    t=$(stamp)
    podman import -q --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "$image" >/dev/null
    touch "$CACHE/.imported-$suite"
    echo "== imported $image ($(took "$t"))" >&2
  fi
  echo "$image"
}

pip_cache=$("$PY" -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")
mkdir -p "$pip_cache"
total=$(stamp)
while read -r role image recipe base suite python cloudpickle torch jupyterhub packages; do
  [ -n "$role" ] || continue
  pull=()
  if [ $local_base = 1 ]; then base=$(debian_base "$suite"); pull=(--pull=never); fi
  args=(--build-arg "BASE=$base" --build-arg PIP_CACHE_DIR=/var/cache/host-pip)
  [ "$recipe" != runner ] && args+=(--build-arg "WHEEL_SHA=$wheel_sha")  # the runner installs no wheel
  # what z2jh's hub image has beyond Python and its configuration needs: a bare local base gets it here
  [ "$recipe" = hub ] && [ $local_base = 1 ] && args+=(--build-arg "EXTRA_PACKAGES=pycurl")
  [ "$python" != - ] && args+=(--build-arg "PYTHON=$python")
  [ "$cloudpickle" != - ] && args+=(--build-arg "CLOUDPICKLE=$cloudpickle")
  [ "$torch" != - ] && args+=(--build-arg "TORCH=$torch")
  [ "$jupyterhub" != - ] && args+=(--build-arg "JUPYTERHUB=$jupyterhub")
  # the notebook's packages (images.json), separated by | (a version range holds commas): the recipe splits them
  [ "$packages" != - ] && args+=(--build-arg "PACKAGES=$packages")
  if [ -f "$CA" ]; then
    args+=(-v "$CA:/etc/gpu-offload-build-ca.crt:ro" --build-arg PIP_CERT=/etc/gpu-offload-build-ca.crt)
  fi
  tags=(-t "$image")
  [ -n "$registry" ] && tags+=(-t "$registry/$image")
  t=$(stamp)
  podman build -q --network host "${pull[@]}" -v "$pip_cache:/var/cache/host-pip" "${args[@]}" "${tags[@]}" \
    -f "$HERE/$recipe/Dockerfile" "$context" >/dev/null
  size=$(podman image inspect --format '{{.Size}}' "$image")
  echo "== $role: $image on $base, $((size / 1000000)) MB ($(took "$t"))"
done <<<"$plan"
echo "== all built in $(took "$total")"
