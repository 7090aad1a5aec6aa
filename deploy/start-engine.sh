#!/bin/sh
# A Docker engine for the compose test (tests/deploy/test_compose_engine.py), where one can be had: an engine
# that already answers is used as it is; otherwise, as root with apt, Debian's docker.io and debootstrap are
# installed and dockerd started in the background (its images and build cache stay in /var/lib/docker, so a
# later run on the same machine reuses the layers). Exits 1, saying why, where none can be had: the test
# then skips. .ci/run calls it before the test suite, so a broken image build is a red CI, not a skip.
DOCKER="${DOCKER:-/usr/bin/docker}"
if [ -x "$DOCKER" ] && "$DOCKER" info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "start-engine: not root with apt: no Docker engine (the compose test skips)" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || [ ! -x /usr/bin/docker ]; then
  (apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1 ||
    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1)) || {
    echo "start-engine: apt could not install docker.io and debootstrap" >&2
    exit 1
  }
fi
if ! pgrep -x dockerd >/dev/null; then
  nohup dockerd >/var/log/ttcore-dockerd.log 2>&1 &
fi
for _ in $(seq 60); do
  if /usr/bin/docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "start-engine: dockerd did not answer within 60 s (see /var/log/ttcore-dockerd.log)" >&2
exit 1
