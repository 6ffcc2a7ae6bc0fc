#!/usr/bin/env bash
# Podman for compose.yaml on a host that reaches package registries only (no image registry,
# no Docker engine): installs podman, runc and a compose client, makes a Debian base image
# offline (mmdebstrap from the host's Debian mirror; cached), a wheelhouse of the project's
# dependencies (from PyPI; cached) and builds the compose images from them.
#
#   sudo deploy/podman/setup.sh          # idempotent; seconds once its caches are warm
#   export VRAMFABRIC_BASE=...           # the line it prints, then the README's command
#   podman-compose --profile simulated up --build --exit-code-from coordinator
#
# Cache: $VRAMFABRIC_PODMAN_CACHE (default /var/cache/vramfabric-podman): the base image's
# tarball, keyed by what goes into it, the wheels, keyed by the dependencies, the compose
# client, and env (the settings the tests read once the engine and base image are ready).
# Log: $CACHE/setup.log. Exit status 0 when everything is built; the reason on stderr if not.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${VRAMFABRIC_PODMAN_CACHE:-/var/cache/vramfabric-podman}
SUITE=bookworm                              # its python3 is 3.11, as the wheels below
BASE_PACKAGES=python3,python3-venv,ca-certificates
PODMAN_COMPOSE=podman-compose==1.6.0
# podman and runc (crun refuses hybrid cgroups), netavark and aardvark-dns (a bridge network
# whose containers find each other by name), iptables for netavark, mmdebstrap for the base.
APT_PACKAGES=(podman runc conmon netavark aardvark-dns iptables mmdebstrap)
MARK="# Written by vramfabric deploy/podman/setup.sh"

mkdir -p "$CACHE"
exec 2> >(tee -a "$CACHE/setup.log" >&2)
say() { echo "podman setup: $*" >&2; }
fail() { say "$*"; exit 1; }
echo "--- $(date -u +%FT%TZ) $ROOT" >>"$CACHE/setup.log"
[ "$(id -u)" = 0 ] || fail "needs root (apt-get, /etc/containers, rootful podman)"
# One setup at a time: two would build the same base image twice.
exec 9>"$CACHE/lock"
flock -w 900 9 || fail "another setup has held $CACHE/lock for 15 minutes"
START_S=$SECONDS
# Written again below once the engine and base image are ready: a setup that fails before
# then leaves the tests skipping, with this log's last line as the reason.
rm -f "$CACHE/env"

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  command -v apt-get >/dev/null || fail "no apt-get to install ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >>"$CACHE/setup.log" 2>&1 \
    || fail "apt-get could not install ${missing[*]} (see $CACHE/setup.log)"
fi

# Hosts like this one: hybrid cgroups v1 and no systemd (cgroupfs, runc, events to a file),
# and setting ulimits is refused (none set by default). A file of another origin is kept.
CONF=/etc/containers/containers.conf
if [ ! -e "$CONF" ] || head -n1 "$CONF" | grep -qF "$MARK"; then
  mkdir -p /etc/containers
  cat >"$CONF" <<EOF
$MARK: podman on hosts with hybrid cgroups,
# no systemd, and where setting ulimits is refused.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
elif ! grep -q "default_ulimits *= *\[\]" "$CONF"; then
  say "warning: $CONF is not ours and sets no 'default_ulimits = []': containers may not start"
fi
podman info >/dev/null 2>>"$CACHE/setup.log" || fail "podman does not run (see $CACHE/setup.log)"

# The compose client, in a venv of its own.
TOOLS="$CACHE/tools"
if [ ! -x "$TOOLS/bin/podman-compose" ] \
  || [ "$("$TOOLS/bin/pip" show podman-compose 2>/dev/null | grep ^Version:)" \
       != "Version: ${PODMAN_COMPOSE#*==}" ]; then
  say "installing $PODMAN_COMPOSE"
  rm -rf "$TOOLS"
  { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "$PODMAN_COMPOSE"; } \
    >>"$CACHE/setup.log" 2>&1 || fail "could not install $PODMAN_COMPOSE (see $CACHE/setup.log)"
fi
[ -e /usr/local/bin/podman-compose ] || ln -s "$TOOLS/bin/podman-compose" /usr/local/bin/

# The base image: Debian from the host's own mirror, keyed by everything that goes into it.
MIRROR=${VRAMFABRIC_DEBIAN_MIRROR:-$(awk '($1 == "URIs:" || $1 == "deb") && !/security/ \
  {print $2; exit}' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KEY=$(printf '%s\n' mmdebstrap minbase "$SUITE" "$MIRROR" "$BASE_PACKAGES" | sha256sum | cut -c1-12)
BASE="localhost/vramfabric-base:$SUITE-$KEY"
TARBALL="$CACHE/base-$SUITE-$KEY.tar"
if ! podman image exists "$BASE"; then
  if [ ! -s "$TARBALL" ]; then
    say "making the base image ($SUITE from $MIRROR; about 2 minutes, once)"
    rm -f "$CACHE"/base-*.tar
    mmdebstrap --quiet --format=tar --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$TARBALL.part" \
      "$MIRROR" >>"$CACHE/setup.log" 2>&1 || fail "mmdebstrap failed (see $CACHE/setup.log)"
    mv "$TARBALL.part" "$TARBALL"
  fi
  podman import --quiet "$TARBALL" "$BASE" >/dev/null || fail "podman import of $TARBALL failed"
fi
# The tests read this once the engine and base image are ready; a failed build below is then
# a failed test, not a skipped one.
printf 'VRAMFABRIC_BASE=%s\nPODMAN_COMPOSE=%s\n' "$BASE" "$TOOLS/bin/podman-compose" \
  >"$CACHE/env"

# The wheelhouse: every dependency as a wheel for the base image's Python (3.11, glibc 2.36),
# and setuptools for building the project itself; the build context copies it in.
DEPS=$(python3 - "$ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(["setuptools>=69", *project["project"]["dependencies"]]))
EOF
)
# pip wheel builds those published as source only (nkeys) with the tools' Python, which must
# then be the base image's.
PY=$("$TOOLS/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
[ "$PY" = cp311 ] || fail "the wheelhouse needs Python 3.11 ($SUITE's), and python3 here is $PY"
WHEELS="$CACHE/wheels-$(printf '%s\n' "$PY" "$DEPS" | sha256sum | cut -c1-12)"
if [ ! -d "$WHEELS" ]; then
  say "making the wheelhouse"
  rm -rf "$CACHE"/wheels-*
  mapfile -t deps <<<"$DEPS"
  "$TOOLS/bin/pip" wheel -q --wheel-dir "$WHEELS.part" "${deps[@]}" >>"$CACHE/setup.log" 2>&1 \
    || fail "pip wheel of the wheelhouse failed (see $CACHE/setup.log)"
  mv "$WHEELS.part" "$WHEELS"
fi
HOUSE="$ROOT/deploy/podman/wheelhouse"
find "$HOUSE" -name '*.whl' -delete
cp "$WHEELS"/*.whl "$HOUSE/"

# The compose images, one build at a time (a compose client would run them all at once).
say "building the images"
podman build --quiet --build-arg BASE="$BASE" -t vramfabric:latest "$ROOT" >/dev/null \
  2>>"$CACHE/setup.log" || fail "podman build of vramfabric:latest failed (see $CACHE/setup.log)"
podman build --quiet --build-arg BASE="$BASE" -t vramfabric-prometheus:latest \
  "$ROOT/deploy/prometheus" >/dev/null 2>>"$CACHE/setup.log" \
  || fail "podman build of vramfabric-prometheus:latest failed (see $CACHE/setup.log)"
# nats:latest for the testcontainers fixture (deploy/podman/nats.Dockerfile), unless an image
# of that name that is not ours is there.
NATS=docker.io/library/nats:latest
if ! podman image exists "$NATS" \
  || [ "$(podman image inspect --format '{{index .Labels "org.vramfabric.stand-in"}}' "$NATS")" \
       = nats:latest ]; then
  podman build --quiet -t "$NATS" -f "$ROOT/deploy/podman/nats.Dockerfile" "$ROOT/deploy/podman" \
    >/dev/null 2>>"$CACHE/setup.log" || fail "podman build of the nats:latest stand-in failed"
fi
# Images the rebuilds above left unnamed, and base images of other keys: disk, not cache.
podman image prune --force >/dev/null 2>&1 || true
podman images --format '{{.Repository}}:{{.Tag}}' localhost/vramfabric-base 2>/dev/null \
  | grep -vxF "$BASE" | xargs -r podman rmi >/dev/null 2>&1 || true
say "ready in $((SECONDS - START_S)) s; for the README's compose command:"
echo "export VRAMFABRIC_BASE=$BASE"
