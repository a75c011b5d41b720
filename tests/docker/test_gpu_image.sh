#!/usr/bin/env bash
# test_gpu_image.sh - the GPU image built and checked on a machine without a GPU: its own dockerd
# (tests/docker/dockerd.sh), the Debian 12 base (docker/base-image.sh), the CUDA base images made
# from this machine's CUDA toolkit and cuDNN (docker/cuda-base.sh), then ddpmd:gpu built on them
# (docker/build.sh; the CUDA backend for the release's architectures), and in that image:
#  - every library of ddpmd, of the CUDA module libddpmd_cuda.so and of the CUDA libraries in the
#    image resolves (ldd), and those loaded only at run time are there: the cuDNN sub-libraries
#    the shim opens for the legacy convolution API and NVRTC (cuda-base.sh says why);
#  - the module loads: `ddpmd plan --device cuda:0` fails for want of a GPU (the driver), not
#    with "cannot load the CUDA backend module";
#  - `ddpmd serve` (host network, 127.0.0.1) serves the cpu device: /healthz, GET /devices;
#  - `ddpmd serve --device cuda:0` exits 1 at start and says that cuda:0 has no CUDA device;
#  - docker/compose.gpu.yaml makes ddpmd from it on cuda:0 with one GPU requested from the
#    NVIDIA driver, which Docker here does not have (starting it fails saying so).
# Prints the images' sizes and the build times. A stage of scripts/test.sh (the README says why,
# and what it costs). Exit 77 (skipped) without root, Docker, docker-compose, debootstrap or the
# CUDA toolkit. DDPMD_DOCKER_HOST=unix://SOCKET runs it on a daemon that has the images already.
# Usage: tests/docker/test_gpu_image.sh (CUDA_HOME, CUDNN_HOME as for docker/cuda-base.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/docker/dockerd.sh
dk_skip_unless_usable docker-compose
[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || { echo "SKIP: no CUDA toolkit (nvcc)"; exit 77; }

t_start=$(date +%s)
dk_start
image=ddpmd:gpu
fail() { echo "FAIL: $*" >&2; exit 1; }

bash docker/base-image.sh
t0=$(date +%s)
bash docker/cuda-base.sh >"$W/bases"
read -r devel runtime < <(tail -n1 "$W/bases")
t1=$(date +%s)
bash docker/build.sh "$image" docker/Dockerfile --network host -q \
  --build-arg BUILD_BASE="$devel" --build-arg BASE="$runtime" >/dev/null
t2=$(date +%s)

in_image() { "$DOCKER" run --rm --network none --entrypoint /bin/bash "$image" -c "$1"; }

# the libraries: every NEEDED one of the binary, the module and the CUDA libraries resolves ...
missing=$(in_image 'for f in /opt/ddpmd/bin/ddpmd /opt/ddpmd/bin/libddpmd_cuda.so /opt/ddpmd/lib/*.so* \
  /usr/local/cuda/lib/*.so*; do [ -e "$f" ] || echo "$f: missing"; ldd "$f" | sed -n "s|not found|&: $f|p"; done')
[ -z "$missing" ] || fail "libraries that do not resolve in $image: $missing"
# ... and so does each one opened with dlopen, by the name it is opened with: cuDNN's shim opens
# the sub-libraries of the API the module calls (graph, ops, cnn), graph the engines and the
# heuristic, which with cuBLASLt open NVRTC (libnvrtc.so.MAJOR) and NVRTC its builtins
major=$(in_image 'ls /usr/local/cuda/lib/' | sed -n 's/^libcudart\.so\.\([0-9]*\)$/\1/p')
[ -n "$major" ] || fail "no libcudart.so.N in $image"
dl="libcudnn_graph.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9 libcudnn_engines_precompiled.so.9
    libcudnn_engines_runtime_compiled.so.9 libcudnn_heuristic.so.9 libnvrtc.so.$major"
cache=$(in_image 'ldconfig -p')
for l in $dl; do
  grep -q "^[[:space:]]*$l " <<<"$cache" || fail "$l (opened at run time) is not in $image's loader cache"
done
in_image 'ls /usr/local/cuda/lib/' | grep -q "^libnvrtc-builtins\.so\.$major\." ||
  fail "no libnvrtc-builtins.so.$major.* in $image"

# the module loads in ddpmd; only the GPU (its driver) is missing
out=$(in_image 'ddpmd plan --device cuda:0 2>&1; echo "exit $?"')
grep -q "cannot load" <<<"$out" && fail "ddpmd plan --device cuda:0 in $image: $out"
grep -q "cuda:0: no CUDA device" <<<"$out" || fail "ddpmd plan --device cuda:0 in $image: $out"

# ddpmd serve on the cpu device, on a loopback port of the host's network
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
on_cleanup '[ -z "${cid:-}" ] || "$DOCKER" rm -fv "$cid"'
cid=$("$DOCKER" run -d --network host "$image" --listen "127.0.0.1:$port" --device cpu)
ok=0
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; then ok=1; break; fi
  sleep 0.5
done
[ $ok -eq 1 ] || fail "ddpmd serve in $image never answered /healthz: $("$DOCKER" logs "$cid" 2>&1 | tail -5)"
devices=$(curl -sf "http://127.0.0.1:$port/devices" | python3 -c 'import json, sys
print(" ".join(d["name"] for d in json.load(sys.stdin)["devices"]))')
[ "$devices" = cpu ] || fail "GET /devices of ddpmd serve --device cpu in $image: $devices"
"$DOCKER" rm -fv "$cid" >/dev/null
cid=

# ddpmd serve on cuda:0 without a GPU: it stops at start and says why
rc=0
out=$(timeout 120 "$DOCKER" run --rm --network none "$image" --listen 127.0.0.1:8080 --device cuda:0 2>&1) || rc=$?
[ $rc -eq 1 ] || fail "ddpmd serve --device cuda:0 without a GPU: exit $rc: $out"
grep -q "cuda:0: no CUDA device" <<<"$out" || fail "ddpmd serve --device cuda:0 without a GPU says: $out"

# compose.gpu.yaml over compose.yaml: ddpmd made from the GPU image, on cuda:0, with one GPU
# requested from the daemon's NVIDIA driver; starting it here fails for want of that driver
export DDPMD_TOKENS=$W/tokens DDPMD_IMAGE=$image
echo "tester $(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$DDPMD_TOKENS"
gpu=(docker-compose -p "ddpmdgpu$$" -f docker/compose.yaml -f docker/compose.gpu.yaml)
on_cleanup '"${gpu[@]}" down -v'
"${gpu[@]}" up --no-start --no-deps ddpmd >"$W/compose.log" 2>&1 || fail "compose.gpu.yaml: $(cat "$W/compose.log")"
c=$("${gpu[@]}" ps -q ddpmd)
[ -n "$c" ] || fail "compose.gpu.yaml made no ddpmd container"
"$DOCKER" inspect "$c" | IMAGE=$image python3 -c 'import json, os, sys
c = json.load(sys.stdin)[0]
req = [(r["Driver"], r["Count"], r["Capabilities"]) for r in c["HostConfig"]["DeviceRequests"] or []]
assert c["Config"]["Image"] == os.environ["IMAGE"], c["Config"]["Image"]
assert req == [("nvidia", 1, [["gpu"]])], req
assert "DDPMD_DEVICE=cuda:0" in c["Config"]["Env"], c["Config"]["Env"]' ||
  fail "compose.gpu.yaml: the ddpmd container's image, device request or environment"
out=$("$DOCKER" start "$c" 2>&1) && fail "the GPU service started without a GPU driver"
grep -q 'could not select device driver "nvidia"' <<<"$out" || fail "starting the GPU service: $out"
t3=$(date +%s)

size() { "$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }
echo "test_gpu_image: ok ($image $(size "$image"); bases: $runtime $(size "$runtime"), $devel" \
  "$(size "$devel"), ddpmd-base:bookworm $(size ddpmd-base:bookworm))"
echo "test_gpu_image: CUDA base images $((t1 - t0)) s, $image build $((t2 - t1)) s, checks $((t3 - t2)) s," \
  "$((t3 - t_start)) s in all"
