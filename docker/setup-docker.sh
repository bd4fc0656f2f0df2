#!/usr/bin/env bash
# Make this machine ready for `make smoke` and `make test`, then print the docker client to use
# (one path on stdout; everything else goes to stderr). `make setup` runs it (a prerequisite of
# `make smoke` and `make test`; .ci/run calls it); it is safe to re-run, and each step is skipped
# when already done.
#
# Where Docker with BuildKit already works (Docker Desktop, docker-ce with buildx), nothing is
# installed or started. On a Debian or Ubuntu machine, as root, what is missing is installed
# from the distribution's packages (apt-get) and the engine is started:
#   docker.io        the engine and a client (Debian's 20.10 runs BuildKit natively)
#   docker-buildx    only where the client is 23 or newer and has no buildx (Ubuntu)
#   docker-compose   the SageMaker Python SDK local modes (tests/test_sdk_local.py, test_sdk_v3.py)
#   debootstrap      `make base` builds the Debian base image with it (no registry needed)
#   docker-registry  tests/test_push.py pushes to a local registry
#   python3-venv, openssh-client   `make venv`; ssh-keygen in the tests
#   chromium         a headless browser for serve's page at / (tests/test_serve_generic_docker.py)
#
# DOCKER=<client> picks the client; it is checked, not replaced. Without it, the first client
# on PATH that can build with BuildKit wins: one with buildx, or a pre-23 client where
# DOCKER_BUILDKIT=1 runs BuildKit natively (a v23+ client without buildx cannot mount build
# secrets, so it is skipped even when it comes first on PATH).
set -euo pipefail

log() { printf 'setup-docker: %s\n' "$*" >&2; }
fail() { log "error: $*"; exit 1; }

export DEBIAN_FRONTEND=noninteractive
can_install() { [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_updated=
apt_install() {
    can_install || return 1
    if [ -z "$apt_updated" ]; then
        log "apt-get update"
        apt-get update -qq >&2
        apt_updated=1
    fi
    log "installing $*"
    apt-get install -y -qq --no-install-recommends "$@" >&2
}

# True when the client can build with BuildKit and mount build secrets.
buildkit_capable() {
    local client=$1 major
    "$client" buildx version >/dev/null 2>&1 && return 0
    major=$("$client" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
    [ -n "$major" ] && [ "$major" -lt 23 ]
}

pick_client() {
    local candidate
    for candidate in $(which -a docker 2>/dev/null | awk '!seen[$0]++'); do
        if buildkit_capable "$candidate"; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

# `setup-docker.sh --pick-client`: print the client only (the Makefile's default DOCKER), and
# install or start nothing: parsing the Makefile (even `make -n`) must not change the machine.
if [ "${1:-}" = "--pick-client" ]; then
    pick_client
    exit
fi

answers() { docker info >/dev/null 2>&1 || { [ -n "${DOCKER:-}" ] && "$DOCKER" info >/dev/null 2>&1; }; }

# 1. Packages, only where something is missing and only with apt-get as root.
if can_install; then
    packages=()
    command -v dockerd >/dev/null 2>&1 || answers || packages+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || packages+=(debootstrap)
    command -v docker-registry >/dev/null 2>&1 || packages+=(docker-registry)
    command -v ssh-keygen >/dev/null 2>&1 || packages+=(openssh-client)
    python3 -m venv --help >/dev/null 2>&1 || packages+=(python3-venv)
    command -v chromium >/dev/null 2>&1 || packages+=(chromium)
    # Compose for the SDK's local mode: `docker compose` (v2 plugin) or docker-compose.
    if ! { docker compose version 2>/dev/null | grep -q v2; } && ! command -v docker-compose >/dev/null 2>&1; then
        packages+=(docker-compose)
    fi
    if [ "${#packages[@]}" -gt 0 ]; then
        apt_install "${packages[@]}"
    fi
fi

# 2. The engine: start dockerd where none answers and we may.
if ! answers; then
    command -v dockerd >/dev/null 2>&1 \
        || fail "no Docker engine answers and none is installed: install Docker (or run as root on Debian/Ubuntu)"
    [ "$(id -u)" -eq 0 ] || fail "no Docker engine answers; start it (or run as root to let this script start dockerd)"
    dockerd_log="${TMPDIR:-/tmp}/sm-horovod-dockerd.log"
    log "starting dockerd (log: $dockerd_log)"
    nohup dockerd >"$dockerd_log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 1 60); do
        answers && break
        kill -0 "$dockerd_pid" 2>/dev/null || break  # it died: no point in waiting
        sleep 1
    done
    answers || { tail -n 5 "$dockerd_log" >&2; fail "dockerd did not start (log: $dockerd_log)"; }
fi

# 3. A BuildKit-capable client.
if [ -n "${DOCKER:-}" ]; then
    client=$(command -v "$DOCKER") || fail "DOCKER=$DOCKER: no such command"
    buildkit_capable "$client" \
        || fail "DOCKER=$DOCKER has no buildx and is too new for DOCKER_BUILDKIT=1; install docker-buildx or set DOCKER= to another client"
else
    if ! client=$(pick_client); then
        apt_install docker-buildx || true
        client=$(pick_client) \
            || fail "no docker client with BuildKit on PATH: install buildx (docker-buildx) or set DOCKER="
    fi
fi
"$client" info >/dev/null 2>&1 || fail "$client cannot reach the Docker engine"

# 4. Compose, installed in step 1 where apt-get could.
if ! { docker compose version 2>/dev/null | grep -q v2; } && ! command -v docker-compose >/dev/null 2>&1; then
    log "warning: no docker compose; tests/test_sdk_local.py will fail (install docker-compose)"
fi

log "docker client $client ($("$client" version --format 'client {{.Client.Version}}, engine {{.Server.Version}}' 2>/dev/null))"
printf '%s\n' "$client"
