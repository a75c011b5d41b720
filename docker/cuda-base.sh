#!/usr/bin/env bash
# cuda-base.sh - the base images of the GPU image (docker/Dockerfile) without a registry: the
# Debian 12 base (docker/base-image.sh) plus the CUDA toolkit and cuDNN 9 of this machine
# ($CUDA_HOME, default /usr/local/cuda; cuDNN there or in $CUDNN_HOME), in two images:
#   ddpmd-cuda:V-cudnn-devel-bookworm    BUILD_BASE: nvcc (bin/, nvvm/), the headers, and the
#                                        libraries the CUDA module links (cudart, cuBLAS,
#                                        cuBLASLt, cuDNN's libcudnn.so)
#   ddpmd-cuda:V-cudnn-runtime-bookworm  BASE: only what the module loads at run time: libcudart,
#                                        cuBLAS + cuBLASLt, cuDNN's shim and the sub-libraries its
#                                        legacy convolution API loads (graph, ops, cnn, the two
#                                        engine libraries, heuristic; not adv: RNN, attention),
#                                        and NVRTC (cuDNN and cuBLASLt dlopen it for
#                                        runtime-compiled kernels)
# V is the toolkit's release (13.0). The CUDA driver (libcuda.so.1) is not in them: the NVIDIA
# container toolkit mounts the host's at run time (the NVIDIA_* variables below say which
# capabilities and the least CUDA version the driver must support, as NVIDIA's images do).
# Images the daemon already has are kept. Prints the two tags. Needs a docker client that
# reaches the daemon (DOCKER_HOST) and root for base-image.sh's debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."
docker=${DOCKER:-docker}
cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
base=ddpmd-base:bookworm

[ -x "$cuda/bin/nvcc" ] || { echo "cuda-base: no $cuda/bin/nvcc (set CUDA_HOME)" >&2; exit 1; }
ver=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
[ -n "$ver" ] || { echo "cuda-base: cannot read the release of $cuda/bin/nvcc" >&2; exit 1; }
major=${ver%%.*}
devel=ddpmd-cuda:$ver-cudnn-devel-bookworm
runtime=ddpmd-cuda:$ver-cudnn-runtime-bookworm

# cuDNN 9: the first of $CUDNN_HOME, the toolkit, /usr that has libcudnn.so.9 (lib64, lib or the
# Debian multiarch folder) and cudnn.h
find_cudnn() {
  local d l i
  for d in ${CUDNN_HOME:-} "$cuda" /usr; do
    for l in "$d/lib64" "$d/lib" "$d/lib/x86_64-linux-gnu"; do
      [ -e "$l/libcudnn.so.9" ] || continue
      for i in "$d/include" "$d/include/x86_64-linux-gnu"; do
        [ -e "$i/cudnn.h" ] && { cudnn_lib=$(readlink -f "$l") cudnn_inc=$(readlink -f "$i"); return 0; }
      done
    done
  done
  return 1
}
find_cudnn || { echo "cuda-base: no cuDNN 9 (libcudnn.so.9, cudnn.h) in CUDNN_HOME, $cuda or /usr" >&2; exit 1; }

"$docker" image inspect "$base" >/dev/null 2>&1 || bash docker/base-image.sh "$base"

stage=$(mktemp -d "${TMPDIR:-/var/tmp}/ddpmd-cuda-base.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# a file or folder into the build context: hard links where the file system allows (the
# toolkit's libraries are large), else a copy; symbolic links stay links
put() {
  mkdir -p "$(dirname "$2")"
  cp -al "$1" "$2" 2>/dev/null || { rm -rf "$2"; cp -a "$1" "$2"; }
}
# the files of DIR matching the patterns (a library's so-names and links), into DEST
put_matching() {
  local dir=$1 dest=$2 p f
  shift 2
  mkdir -p "$dest"
  for p in "$@"; do
    local found=0
    for f in "$dir"/$p; do
      [ -e "$f" ] || continue
      put "$f" "$dest/$(basename "$f")"
      found=1
    done
    [ $found -eq 1 ] || { echo "cuda-base: nothing in $dir matches $p" >&2; exit 1; }
  done
}
# one image: FROM the Debian base, the staged cuda/ as /usr/local/cuda-$ver (with the usual
# /usr/local/cuda and lib64 links), its lib/ in the loader's cache
build() {
  local tag=$1 env=$2
  cat >"$stage/Dockerfile" <<EOF
FROM $base
COPY cuda/ /usr/local/cuda-$ver/
RUN ln -s cuda-$ver /usr/local/cuda && ln -s lib /usr/local/cuda-$ver/lib64 && \\
    echo /usr/local/cuda-$ver/lib >/etc/ld.so.conf.d/ddpmd-cuda.conf && ldconfig
ENV $env
EOF
  echo "cuda-base: $tag ($(du -sh "$stage/cuda" | cut -f1))"
  tar -C "$stage" -cf - Dockerfile cuda | DOCKER_BUILDKIT=0 "$docker" build -q -t "$tag" - >/dev/null
  rm -rf "$stage/cuda" "$stage/Dockerfile"
}

if ! "$docker" image inspect "$devel" >/dev/null 2>&1; then
  for d in bin nvvm include targets; do put "$cuda/$d" "$stage/cuda/$d"; done
  put_matching "$cuda/lib64" "$stage/cuda/lib" 'libcudart.so*' 'libcudart_static.a' 'libcudadevrt.a' \
    'libcublas.so*' 'libcublasLt.so*' stubs
  put_matching "$cudnn_lib" "$stage/cuda/lib" 'libcudnn.so*'
  [ "$cudnn_inc" = "$(readlink -f "$cuda/include")" ] || put_matching "$cudnn_inc" "$stage/cuda/include" 'cudnn*.h'
  build "$devel" "PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
fi

if ! "$docker" image inspect "$runtime" >/dev/null 2>&1; then
  put_matching "$cuda/lib64" "$stage/cuda/lib" "libcudart.so.$major*" "libcublas.so.$major*" \
    "libcublasLt.so.$major*" "libnvrtc.so.$major*" "libnvrtc-builtins.so.$major.*"
  put_matching "$cudnn_lib" "$stage/cuda/lib" 'libcudnn.so.9*' 'libcudnn_graph.so.9*' \
    'libcudnn_ops.so.9*' 'libcudnn_cnn.so.9*' 'libcudnn_engines_precompiled.so.9*' \
    'libcudnn_engines_runtime_compiled.so.9*' 'libcudnn_heuristic.so.9*'
  # as NVIDIA's runtime images: every GPU and the compute capability by default, the driver's
  # least CUDA release checked by the container toolkit, where older toolkits mount the driver
  build "$runtime" "NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
NVIDIA_REQUIRE_CUDA=cuda>=$ver LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
fi
echo "$devel $runtime"
