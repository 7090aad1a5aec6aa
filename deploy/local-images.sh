#!/bin/sh
# Build what `docker compose up` runs, on a machine whose Docker engine cannot pull from an image registry
# but reaches Debian's mirror and PyPI (as these development machines: Debian's docker.io and debootstrap):
#   1. BASE_IMAGE        Debian bookworm with Debian's Python 3.11 (debootstrap --variant=minbase, docker import);
#                        the Dockerfile's PYTHON_IMAGE, instead of python:3.11-slim-bookworm
#   2. PROMETHEUS_IMAGE  Debian's prometheus package on that base, laid out as prom/prometheus is
#   3. ttcore:latest     docker build with PYTHON_IMAGE=BASE_IMAGE; torch from TORCH_WHEEL when given (a local
#                        CPU wheel, copied into deploy/wheelhouse/) instead of download.pytorch.org
# Then:  PYTHON_IMAGE=ttcore-python:3.11-bookworm PROMETHEUS_IMAGE=ttcore-prometheus:local \
#        docker compose up --no-build ttcore prometheus        (Grafana has no Debian package: left out)
#
#   sudo sh deploy/local-images.sh
#   PIP_CA=/etc/ssl/certs/ca-certificates.crt TORCH_WHEEL=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
#       sh deploy/local-images.sh
# Building behind a TLS-intercepting proxy: PIP_CA is the CA bundle pip must trust; it reaches the build as a
# BuildKit secret (never in a layer, never committed). Needs root (debootstrap), a running dockerd and a docker
# client that builds with BuildKit: Docker >= 23 with the buildx plugin, or Debian bookworm's docker.io (20.10,
# BuildKit built in): DOCKER=/usr/bin/docker when a client without buildx comes first on PATH.
set -eu
cd "$(dirname "$0")/.."
BASE_IMAGE="${BASE_IMAGE:-ttcore-python:3.11-bookworm}"
PROMETHEUS_IMAGE="${PROMETHEUS_IMAGE:-ttcore-prometheus:local}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
ROOTFS="${ROOTFS:-/var/tmp/ttcore-rootfs}"
DOCKER="${DOCKER:-docker}"

if ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ ! -f "$ROOTFS/.ttcore-complete" ]; then  # a half-built root (an earlier failure) is started over
    rm -rf "$ROOTFS"
    # debootstrap's --include does not resolve virtual packages (python3.11-venv depends on
    # python3.11-distutils, which only python3-distutils provides: it failed so on bookworm); apt inside the
    # new root resolves the dependencies of what we name, whatever the distribution's packaging does next
    debootstrap --variant=minbase --include=ca-certificates,passwd bookworm "$ROOTFS" "$MIRROR"
    chroot "$ROOTFS" apt-get update -qq
    chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3.11 python3.11-venv
    chroot "$ROOTFS" python3.11 -m venv --help >/dev/null  # the venv module the Dockerfile uses is there
    touch "$ROOTFS/.ttcore-complete"
  fi
  ln -sf /usr/bin/python3.11 "$ROOTFS/usr/local/bin/python"  # the Dockerfile runs `python`
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
  tar -C "$ROOTFS" -c . | "$DOCKER" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' - "$BASE_IMAGE"
fi

if ! "$DOCKER" image inspect "$PROMETHEUS_IMAGE" >/dev/null 2>&1; then
  "$DOCKER" build -t "$PROMETHEUS_IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg MIRROR="$MIRROR" \
    -f deploy/prometheus.Dockerfile deploy
fi

rm -f deploy/wheelhouse/*.whl
if [ -n "${TORCH_WHEEL:-}" ]; then
  cp "$TORCH_WHEEL" deploy/wheelhouse/
fi
set -- --build-arg PYTHON_IMAGE="$BASE_IMAGE" -t ttcore:latest
if [ -n "${PIP_CA:-}" ]; then
  set -- "$@" --secret id=pip_ca,src="$PIP_CA"
fi
DOCKER_BUILDKIT=1 "$DOCKER" build "$@" .
rm -f deploy/wheelhouse/*.whl
# the ttcore image this build replaced is left untagged (2.2 GB of its own after a change to ttcore/): removed,
# found by the Dockerfile's label (no other project's untagged images)
"$DOCKER" image prune -f --filter label=org.opencontainers.image.title=ttcore >/dev/null
"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^(ttcore|$BASE_IMAGE|$PROMETHEUS_IMAGE)" || true
