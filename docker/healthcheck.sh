#!/bin/bash
# healthcheck.sh - the image's HEALTHCHECK: GET /healthz of the ddpmd serve in this container (the
# port of DDPMD_LISTEN, on loopback) with bash's /dev/tcp, so the image needs no HTTP client.
port=${DDPMD_LISTEN##*:}
exec 3<>"/dev/tcp/127.0.0.1/${port:-8080}" || exit 1
printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
read -r -t 5 version status _ <&3 || exit 1
[ "$status" = 200 ]
