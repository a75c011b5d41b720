#!/usr/bin/env bash
# collect-runtime.sh BUILD_DIR DEST - what docker/Dockerfile's runtime stage takes from the build
# stage: DEST/bin/ddpmd (and libddpmd_cuda.so next to it when the build has the CUDA backend, where
# ddpmd dlopens it) and DEST/lib/ with the shared libraries they link (ldd), except those every
# base image has (the C library, libstdc++, libgcc_s) and the CUDA/cuDNN libraries an NVIDIA
# runtime image provides.
set -euo pipefail
build=$1 dest=$2
mkdir -p "$dest/bin" "$dest/lib"
install -m 0755 "$build/ddpmd" "$dest/bin/ddpmd"
bins=("$dest/bin/ddpmd")
if [ -f "$build/libddpmd_cuda.so" ]; then
  install -m 0644 "$build/libddpmd_cuda.so" "$dest/bin/libddpmd_cuda.so"
  bins+=("$dest/bin/libddpmd_cuda.so")
fi
skip='^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas.*|libcudnn.*|libnvrtc.*|libnvJitLink|libcufft|libcurand)\.so'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// { print $1, $3 }' | while read -r name path; do
    if [[ $name =~ $skip ]]; then continue; fi
    cp -Ln "$path" "$dest/lib/$name"
  done
  if ldd "$b" | grep -q 'not found'; then
    case $b in
      *libddpmd_cuda.so) ;; # the CUDA libraries come with the runtime image
      *) ldd "$b" | grep 'not found' >&2; exit 1 ;;
    esac
  fi
done
echo "collect-runtime: $(ls "$dest/lib" | wc -l) libraries: $(ls "$dest/lib" | tr '\n' ' ')"
