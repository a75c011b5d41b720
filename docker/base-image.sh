#!/usr/bin/env bash
# base-image.sh - the Debian 12 base image for docker/Dockerfile without a registry: a minbase
# root file system made by debootstrap from the mirror apt already uses, imported with
# `docker import` as ddpmd-base:bookworm (or $1). The root file system's tarball is cached in
# $DDPMD_CACHE (default /var/cache/ddpmd) and made again only when it is missing; an image the
# daemon already has is kept. Needs root, debootstrap and a docker client that reaches the daemon
# (DOCKER_HOST).
set -euo pipefail
tag=${1:-ddpmd-base:bookworm}
cache=${DDPMD_CACHE:-/var/cache/ddpmd}
tarball=$cache/debian-bookworm-minbase.tar
docker=${DOCKER:-docker}

if "$docker" image inspect "$tag" >/dev/null 2>&1; then exit 0; fi

# the first Debian mirror of apt's sources (deb822 .sources or one-line .list)
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' "$f"
  done
}

if [ ! -s "$tarball" ]; then
  url=$(mirror | head -n1)
  [ -n "$url" ] || { echo "base-image: no Debian mirror in /etc/apt/sources*" >&2; exit 1; }
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$root" "$tarball.tmp"' EXIT
  echo "base-image: debootstrap --variant=minbase bookworm from $url"
  debootstrap --variant=minbase bookworm "$root" "$url" >"$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
  rm -f "$root.log"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi
echo "base-image: docker import $tarball $tag"
"$docker" import "$tarball" "$tag" >/dev/null
