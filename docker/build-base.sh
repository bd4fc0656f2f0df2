#!/usr/bin/env bash
# Build a minimal Debian base image from Debian's own packages.
#
# Why: the build machines reach Debian's and PyPI's package mirrors but no container
# registry, so `FROM debian:bookworm` cannot be pulled. debootstrap + `docker import`
# gives the same minbase root file system in about 30 seconds. Users with registry
# access can skip this and pass BASE_IMAGE=debian:bookworm-slim to `make build`.
#
# Usage: build-base.sh IMAGE:TAG [SUITE]
set -euo pipefail

image=${1:?usage: build-base.sh IMAGE:TAG [SUITE]}
suite=${2:-bookworm}
docker_cmd=${DOCKER:-docker}

if ! command -v debootstrap >/dev/null 2>&1; then
    echo "build-base: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "build-base: debootstrap needs root" >&2
    exit 1
fi

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT

# No mirror argument: debootstrap's default mirror is the one Debian documents.
debootstrap --variant=minbase "$suite" "$rootfs" >&2
# The package lists are re-fetched by every image build; keep the base small.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin

tar -C "$rootfs" -c . | "$docker_cmd" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    - "$image" >/dev/null
echo "build-base: built $image from Debian $suite" >&2
