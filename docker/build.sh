#!/usr/bin/env bash
# build.sh [TAG] [DOCKERFILE] [docker build options...] - builds an image of docker/ from a
# small build context: the repository's files (tracked and untracked, without what .gitignore
# names: no build folders; nor the docs and the compose and test files, below) and docker/apt/,
# a copy of this machine's apt sources that the build stage's apt-get uses
# (DDPMD_APT_SOURCES=none leaves it empty, e.g. for an Ubuntu-based NVIDIA build image). The
# legacy builder is used (DOCKER_BUILDKIT=0: Debian's docker 20.10 client has no buildx).
# Example: docker/build.sh ddpmd:cpu docker/Dockerfile --network host
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-ddpmd:cpu}
file=${2:-docker/Dockerfile}
shift $(($# < 2 ? $# : 2))
docker=${DOCKER:-docker}

rm -rf docker/apt
mkdir -p docker/apt/sources.list.d
if [ "${DDPMD_APT_SOURCES:-host}" = host ]; then
  [ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list docker/apt/
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && cp "$f" docker/apt/sources.list.d/
  done
fi
# the context: the files git knows of that exist (a deletion not yet committed is skipped) and
# docker/apt's, less those no image uses (the docs, the compose files, the scripts that make
# bases and the tests of the images), so that editing them keeps the image's build cache
{ git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    case $f in
      README.md | docs/* | docker/compose*.yaml | docker/base-image.sh | docker/cuda-base.sh | \
        docker/build.sh | tests/docker/*) continue ;;
    esac
    [ -e "$f" ] && printf '%s\0' "$f"
  done
  find docker/apt -print0; } |
  tar --null --no-recursion -T - -cf - |
  DOCKER_BUILDKIT=0 "$docker" build -t "$tag" -f "$file" "$@" -
