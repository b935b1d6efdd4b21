#!/usr/bin/env bash
# Builds the Dockerfile into a real image and runs it as a platform would, then
# checks what a platform relies on. Used by .ci/run; runnable by hand as root
# with Debian's podman, buildah, runc and debootstrap installed.
#
#   deploy/container/test-image.sh
#
# Checks (each printed as `ok N - …` / `not ok N - …`, then one summary line
# `image: N passed, N failed`; exit 1 on any failure):
#   - the image builds on a locally made base (base-image.sh), or on
#     NODE_IMAGE when given (e.g. node:24-bookworm-slim where a registry is reachable)
#   - it runs non-root, with a read-only root filesystem, a tmpfs /tmp and the
#     configuration mounted read-only
#   - an MCP call (initialize, tools/call) through it reaches a stdio target
#     inside the container
#   - the HEALTHCHECK command passes
#   - an orphaned grandchild of the stdio target is reaped by PID 1 (tini)
#     when it dies: no zombie
#   - `podman stop` drains: the container exits by itself with code 0 (not
#     137, a SIGKILL after the grace period)
#
# Podman runs here with runc and the cgroupfs manager (a CONTAINERS_CONF of its
# own, unless one is set) and host networking, so it works on hosts without
# systemd or a cgroup v2 delegation; the gateway listens on free loopback ports.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

work=$(mktemp -d)
ctr="mcp-proxy-image-test-$$"
image="localhost/mcp-idp-gateway:image-test-$$"
base="localhost/mcp-proxy-base:image-test-$$"
cleanup() {
  podman rm -f -t 0 "$ctr" > /dev/null 2>&1
  podman rmi -f "$image" "$base" > /dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

if [ -z "${CONTAINERS_CONF:-}" ]; then
  cat > "$work/containers.conf" <<'EOF'
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$work/containers.conf"
fi

passed=0
failed=0
n=0
check() { # check <description> <command...>
  local description=$1 started=$SECONDS; shift
  n=$((n + 1))
  if "$@" > "$work/check.out" 2>&1; then
    passed=$((passed + 1)); echo "ok $n - $description ($((SECONDS - started)) s)"
  else
    failed=$((failed + 1)); echo "not ok $n - $description"; sed 's/^/  # /' "$work/check.out" | tail -n 20
    return 1
  fi
}
finish() {
  echo "image: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

# Build ----------------------------------------------------------------------
node_image=${NODE_IMAGE:-}
build_base() {
  [ -n "$node_image" ] && return 0
  "$here/base-image.sh" "$base" && node_image=$base
}
check "a base image with Node.js (local debootstrap + the npm registry's node binary, or NODE_IMAGE)" build_base
[ -n "$node_image" ] || finish

# --format docker keeps HEALTHCHECK (the OCI format has no such field).
build() {
  podman build --format docker --network host --build-arg "NODE_IMAGE=$node_image" -t "$image" "$root"
}
check "the Dockerfile builds" build
podman image exists "$image" || finish

# Run ------------------------------------------------------------------------
mcp_port=$(free_port)
admin_port=$(free_port)
mkdir -p "$work/etc" "$work/fixtures"
cp "$here/echo-server.mjs" "$work/fixtures/echo-server.mjs"
# The stdio target leaves an orphan behind ((sleep &) exits at once), which is
# reparented to PID 1 of the container: tini must reap it when it dies.
cat > "$work/etc/config.yaml" <<EOF
mcp:
  port: $mcp_port
  targets:
    - name: echo
      stdio:
        cmd: sh
        args: ["-c", "(sleep 600 &); exec node /fixtures/echo-server.mjs"]
admin:
  port: $admin_port
EOF
chmod -R a+rX "$work/etc" "$work/fixtures"

# Explicit limits: podman's defaults (raised limits) cannot be set where the
# runtime may not raise them. Within this shell's soft limits, and what a
# gateway with a few stdio children needs.
nofile=$(ulimit -Sn); [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ] && nofile=65536
nproc=$(ulimit -Su); [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ] && nproc=4096
run() {
  podman run -d --name "$ctr" --network host --read-only --tmpfs /tmp \
    --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" \
    -e "MCP_PROXY_ADMIN_URL=http://127.0.0.1:$admin_port" \
    -v "$work/etc/config.yaml:/etc/mcp-proxy/config.yaml:ro" \
    -v "$work/fixtures:/fixtures:ro" "$image"
}
check "the container starts with a read-only root, a tmpfs /tmp and the config mounted" run || finish

listening() { # until the MCP port accepts, at most 30 s
  for _ in $(seq 1 300); do
    curl -s -o /dev/null "http://127.0.0.1:$mcp_port/mcp" && return 0
    [ "$(podman inspect -f '{{.State.Running}}' "$ctr" 2>/dev/null)" = true ] || { podman logs "$ctr"; return 1; }
    sleep 0.1
  done
  podman logs "$ctr"; return 1
}
check "the gateway listens on mcp.port" listening || finish

non_root() {
  local uid
  uid=$(podman exec "$ctr" sh -c 'for p in /proc/[0-9]*; do if grep -qa mcp-proxy.js "$p/cmdline" 2>/dev/null && ! grep -qa tini "$p/cmdline"; then awk "/^Uid:/{print \$2}" "$p/status"; fi; done' | head -n 1)
  echo "gateway uid: $uid"
  [ -n "$uid" ] && [ "$uid" != 0 ]
}
check "the gateway process runs as a non-root user" non_root

read_only() {
  if podman exec "$ctr" sh -c 'echo x > /opt/mcp-proxy/written' 2>&1; then echo "/opt/mcp-proxy was writable"; return 1; fi
  podman exec "$ctr" sh -c 'echo x > /tmp/written && rm /tmp/written'
}
check "the root filesystem is read-only and /tmp writable" read_only

mcp_call() {
  local headers="$work/headers" body sid
  body=$(curl -sS -D "$headers" -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    --data '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"image-test","version":"1"}}}' \
    "http://127.0.0.1:$mcp_port/mcp") || return 1
  echo "$body" | grep -q '"image-echo"' || { echo "initialize: $body"; return 1; }
  sid=$(awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' "$headers" | tr -d '\r')
  [ -n "$sid" ] || { echo "no Mcp-Session-Id"; cat "$headers"; return 1; }
  curl -sS -o /dev/null -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    -H "mcp-session-id: $sid" -H 'mcp-protocol-version: 2025-11-25' \
    --data '{"jsonrpc":"2.0","method":"notifications/initialized"}' "http://127.0.0.1:$mcp_port/mcp" || return 1
  body=$(curl -sS -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    -H "mcp-session-id: $sid" -H 'mcp-protocol-version: 2025-11-25' \
    --data '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"from the image"}}}' \
    "http://127.0.0.1:$mcp_port/mcp") || return 1
  echo "$body" | grep -q 'Echo: from the image' || { echo "tools/call: $body"; return 1; }
}
check "an MCP initialize + tools/call reaches the stdio target inside the image" mcp_call

healthcheck() {
  podman image inspect "$image" | grep -q '"mcp-proxy-healthcheck"' || { echo "no HEALTHCHECK in the image"; return 1; }
  podman healthcheck run "$ctr"
}
check "the image's HEALTHCHECK passes" healthcheck

no_zombie() {
  local pid state
  pid=$(podman exec "$ctr" sh -c 'for p in /proc/[0-9]*; do if [ "$(cat $p/comm 2>/dev/null)" = sleep ]; then echo ${p#/proc/}; fi; done' | head -n 1)
  [ -n "$pid" ] || { echo "the orphaned grandchild was not found"; return 1; }
  podman exec "$ctr" awk '/^PPid:/{ if ($2 != 1) { print "parent " $2 ", not PID 1"; exit 1 } }' "/proc/$pid/status" || return 1
  podman exec "$ctr" sh -c "kill $pid" || return 1
  for _ in $(seq 1 100); do # until it is gone from the process table, at most 10 s
    state=$(podman exec "$ctr" awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null) || return 0
    [ -z "$state" ] && return 0
    sleep 0.1
  done
  echo "pid $pid still in state $state after it died (a zombie: PID 1 did not reap it)"
  return 1
}
check "an orphaned grandchild of a stdio target is reaped by PID 1 when it dies" no_zombie

stop_drains() {
  podman stop -t 10 "$ctr" > /dev/null || return 1
  local code
  code=$(podman inspect -f '{{.State.ExitCode}}' "$ctr")
  echo "exit code $code"
  podman logs "$ctr" 2>&1 | tail -n 5
  [ "$code" = 0 ]
}
check "podman stop drains the gateway: it exits by itself with code 0" stop_drains

finish
