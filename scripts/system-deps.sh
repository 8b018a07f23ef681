#!/usr/bin/env bash
# System packages and services the test suite needs. Safe to run twice; fast when all is in place.
#
# 1. Debian packages (apt, only those missing): bubblewrap (process sandbox), docker.io (engine +
#    CLI), busybox-static and python3 (the offline sandbox image is built from them), chromium and
#    chromium-driver (the trajectory viewer's browser tests, tests/viewer).
# 2. A Docker engine: if none answers, start dockerd in the background with networking it cannot
#    touch (--iptables=false --ip6tables=false --bridge=none: sandboxes run with --network none),
#    falling back to --storage-driver=vfs where overlayfs is unavailable. Log: $AGENTRL_DOCKERD_LOG.
# 3. The sandbox image agentrl-sandbox:latest, built offline (sandbox/build-image.sh) unless an
#    image with the current executor is already there.
#
# Without root, nothing is installed or started: the script says what is missing and exits 0, and
# the tests that need a missing engine skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "system-deps: $*" >&2; }
DOCKERD_LOG="${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}"
DOCKER_WAIT_S="${AGENTRL_DOCKER_WAIT_S:-30}"
start=$(date +%s)

is_root() { [[ "$(id -u)" == 0 ]]; }

# ---------------------------------------------------------------------------------------- packages
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
[[ -x /usr/bin/python3 ]] || missing+=(python3)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if ((${#missing[@]})); then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/agentrl-apt.log 2>&1; then
            apt-get update >>/tmp/agentrl-apt.log 2>&1
            apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/agentrl-apt.log 2>&1 \
                || { log "apt-get install failed; see /tmp/agentrl-apt.log"; tail -5 /tmp/agentrl-apt.log >&2; }
        fi
    else
        log "missing ${missing[*]}; install them as root: apt-get install -y ${missing[*]}"
    fi
fi

# ---------------------------------------------------------------------------------- docker engine
docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

start_dockerd() {  # $@: extra flags
    log "starting dockerd $* (log: $DOCKERD_LOG)"
    setsid nohup dockerd --iptables=false --ip6tables=false --bridge=none "$@" >>"$DOCKERD_LOG" 2>&1 </dev/null &
    local pid=$! deadline=$(($(date +%s) + DOCKER_WAIT_S))
    while (($(date +%s) < deadline)); do
        docker_ok && { log "dockerd ready (pid $pid)"; return 0; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    log "dockerd $* did not answer; last log lines:"; tail -5 "$DOCKERD_LOG" >&2 || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
}

if command -v docker >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1; then
    if ! docker_ok; then
        if is_root; then
            if pgrep -x dockerd >/dev/null 2>&1; then
                # A dockerd that does not answer is starting or wedged: give it the same deadline.
                for _ in $(seq 1 $((DOCKER_WAIT_S * 5))); do docker_ok && break; sleep 0.2; done
            fi
            docker_ok || start_dockerd || start_dockerd --storage-driver=vfs \
                || log "no Docker engine could start; docker sandbox tests will skip"
        else
            log "no Docker engine answers and we are not root; start one (dockerd) to run the docker tests"
        fi
    fi
    # ------------------------------------------------------------------------------ sandbox image
    if docker_ok; then
        sandbox/build-image.sh || log "building the sandbox image failed; docker sandbox tests will skip"
    fi
fi
log "done in $(($(date +%s) - start)) s"
