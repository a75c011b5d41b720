#!/usr/bin/env bash
# test_container.sh - the CPU image in Docker, end to end: starts its own dockerd
# (tests/docker/dockerd.sh), makes the Debian 12 base image
# (docker/base-image.sh: debootstrap, cached in $DDPMD_CACHE), builds the ddpmd and nginx images
# (docker/build.sh, host network), starts docker/compose.yaml with the host-network override
# (ddpmd and nginx on distinct 127.0.0.1 ports) and runs tests/docker/container_flow.py through
# nginx: a training job followed over SSE, `docker restart` of the ddpmd container mid-training,
# the job resumed from its checkpoint on the volume, checkpoint download, POST /samples, the PNG.
# Then compose.yaml as shipped (its bridge network, the restart policy; nginx's port on 127.0.0.1
# only) and tests/docker/compose_flow.py: ddpmd killed from the host mid-training and started
# again by Docker, reached by nginx, the job resumed; dockerd restarted, both containers back.
# Everything it started is removed on exit, failed or not (tests/docker/dockerd.sh).
# Exit 77 (skipped) without root or without dockerd / docker-compose / debootstrap
# (scripts/install-deps.sh installs them). Usage: tests/docker/test_container.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/docker/dockerd.sh
dk_skip_unless_usable docker-compose

t_start=$(date +%s)
dk_start
project=ddpmdtest$$
compose=(docker-compose -p "$project" -f "$W/compose.yaml")
on_cleanup '"${compose[@]}" logs --no-color --tail 80; "${compose[@]}" down -v --timeout 60'

t0=$(date +%s)
bash docker/base-image.sh
t1=$(date +%s)
bash docker/build.sh ddpmd:cpu docker/Dockerfile --network host -q >/dev/null
bash docker/build.sh ddpmd-nginx docker/nginx.Dockerfile --network host -q >/dev/null
t2=$(date +%s)
echo "test_container: base image $((t1 - t0)) s, image builds $((t2 - t1)) s"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export DDPMD_PORT NGINX_PORT DDPMD_TOKENS=$W/tokens
DDPMD_PORT=$(free_port)
NGINX_PORT=$(free_port)
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "tester $token" >"$DDPMD_TOKENS"
chmod 0644 "$DDPMD_TOKENS" # the secret is bind-mounted: the container's user 10001 reads it
# compose.yaml with the host-network override, merged; Compose v1 cannot drop a list in an
# override, and a host-network container must not publish ports, so nginx's ports go here
docker-compose -p "$project" -f docker/compose.yaml -f docker/compose.host.yaml config |
  python3 -c 'import sys, yaml
HOLD = {"DDPMD_TEST_HOLD_STEP": "7", "DDPMD_TEST_HOLD_FILE": "/data/ddpmd-test-release"}
c = yaml.safe_load(sys.stdin)
for s in c["services"].values():
    if s.get("network_mode") == "host":
        s.pop("ports", None)
c["services"]["ddpmd"].setdefault("environment", {}).update(HOLD)
yaml.safe_dump(c, sys.stdout)' >"$W/compose.yaml"
"${compose[@]}" up -d >"$W/compose-up.log" 2>&1 || { cat "$W/compose-up.log" >&2; exit 1; }
container=$("${compose[@]}" ps -q ddpmd)
[ -n "$container" ] || { echo "FAIL: the ddpmd container did not start" >&2; exit 1; }
python3 tests/docker/container_flow.py "$NGINX_PORT" "$token" "$container" "$DOCKER"
t3=$(date +%s)

# compose.yaml as shipped, on its bridge network: the one change, nginx's port published on
# 127.0.0.1 only (PORT:8080 -> 127.0.0.1:PORT:8080), so every request goes to loopback
"${compose[@]}" down -v --timeout 60 >/dev/null 2>&1
HTTP_PORT=$(free_port)
docker-compose -p "$project" -f docker/compose.yaml config |
  HTTP_PORT=$HTTP_PORT python3 -c 'import os, sys, yaml
HOLD = {"DDPMD_TEST_HOLD_STEP": "7", "DDPMD_TEST_HOLD_FILE": "/data/ddpmd-test-release"}
c = yaml.safe_load(sys.stdin)
for s in c["services"].values():
    assert "network_mode" not in s
    s["ports"] = ["127.0.0.1:%s:8080" % os.environ["HTTP_PORT"]] if "ports" in s else []
c["services"]["ddpmd"].setdefault("environment", {}).update(HOLD)
yaml.safe_dump(c, sys.stdout)' >"$W/compose.yaml"
"${compose[@]}" up -d >"$W/compose-up.log" 2>&1 || { cat "$W/compose-up.log" >&2; exit 1; }
ddpmd=$("${compose[@]}" ps -q ddpmd)
nginx=$("${compose[@]}" ps -q nginx)
flow=(python3 tests/docker/compose_flow.py)
args=("$HTTP_PORT" "$token" "$DOCKER" "$ddpmd" "$nginx")
"${flow[@]}" start "${args[@]}" >"$W/job" || { cat "$W/job"; exit 1; }
job=$(tail -n1 "$W/job")
"${flow[@]}" crash "${args[@]}" "$job"
dk_restart
"${flow[@]}" rebooted "${args[@]}" "$job"
t4=$(date +%s)
echo "test_container: ok (host-network flow $((t3 - t2)) s, bridge-network flow $((t4 - t3)) s," \
  "$((t4 - t_start)) s in all)"
