#!/bin/bash
# nginx-entrypoint.sh - the nginx image's entry point: docker/nginx.conf with @LISTEN@ and
# @UPSTREAM@ from NGINX_LISTEN and DDPMD_UPSTREAM, then nginx in the foreground (daemon off in
# the config) with its pid and temporary files under /var/lib/ddpmd-nginx.
set -euo pipefail
dir=/var/lib/ddpmd-nginx
sed -e "s|@LISTEN@|${NGINX_LISTEN}|" -e "s|@UPSTREAM@|${DDPMD_UPSTREAM}|" \
  /etc/ddpmd-nginx/nginx.conf.in >"$dir/nginx.conf"
exec nginx -p "$dir/" -c nginx.conf -e stderr
