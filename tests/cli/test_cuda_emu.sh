#!/usr/bin/env bash
# test_cuda_emu.sh - `--device cuda:N` end to end under the CPU emulator of CUDA (the CUDA
# backend's own sources built against tests/gpu/emu: libddpmd_cuda_emu.so, loaded through
# DDPMD_CUDA_MODULE as the real module would be): `ddpmd train --device cuda:0 --deterministic`
# of a tiny model against the same run on the CPU (the losses of every step within a tolerance;
# parity mode, as every comparison with the CPU), `ddpmd sample
# --device cuda:0` against the CPU's images, `ddpmd plan --device cuda:0 --json` reporting the
# device and what the process holds there, the errors for a missing device or module, a
# reservation larger than the device, a spec with memory.vram_budget and offload on (the
# optimizer on the host, the gradients out on the copy stream) against the CPU's run, every byte
# the process held on the device (EMU_ALLOC_LOG: the warm-up's, then the plan's one reservation
# and nothing else), a budget no plan fits, and a sticky fault (EMU_FAULT_AT_LAUNCH) that poisons
# the device: the job fails with the error, exit status 3 and as its last stderr line
# "ddpmd: device cuda:N is poisoned: ..." (what ddpmd serve's pool reads).
# Usage: test_cuda_emu.sh DDPMD LIBDDPMD_CUDA_EMU
set -u
ddpmd=${1:?path to ddpmd}
emu=${2:?path to libddpmd_cuda_emu.so}
dir=$(mktemp -d /tmp/ddpmd-test-cuda-emu-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/spec.json" <<'JSON'
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 16, "block_out_channels": [8, 8],
             "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist", "fmnist_resize": "resize" },
  "train": { "batch": 2, "steps": 2, "warmup": 0, "threads": 1 },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": 1 } }
JSON
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
export EMU_DEVICE_MB=512
cuda() { DDPMD_CUDA_MODULE="$emu" "$ddpmd" "$@"; }

# names that are no device, a device the machine lacks, a module that is not there
"$ddpmd" train "$dir/spec.json" --out "$dir/x" --device gpu0 > /dev/null 2> "$dir/e1"
rc=$?
check '[ $rc -eq 2 ] && grep -q "unknown device" "$dir/e1"' "--device gpu0: exit $rc, $(cat "$dir/e1")"
cuda train "$dir/spec.json" --out "$dir/x" --device cuda:3 > /dev/null 2> "$dir/e2"
rc=$?
check '[ $rc -eq 2 ] && grep -q "no such CUDA device: cuda:3 (this machine has 1)" "$dir/e2"' \
      "--device cuda:3 on one device: exit $rc, $(cat "$dir/e2")"
DDPMD_CUDA_MODULE="$dir/none.so" "$ddpmd" sample "$dir/none.safetensors" --device cuda:0 \
    > /dev/null 2> "$dir/e3"
rc=$?
check '[ $rc -eq 1 ] && grep -q "cannot load the CUDA backend module" "$dir/e3"' \
      "missing module: exit $rc, $(cat "$dir/e3")"
check '[ ! -e "$dir/x" ]' "a refused device still made the output folder"

# plan: the device, its memory and what the process holds after the warm-up
cuda plan "$dir/spec.json" --device cuda:0 --json > "$dir/plan.json" 2> "$dir/plan.err"
rc=$?
check '[ $rc -eq 0 ]' "plan --device cuda:0: exit $rc, $(cat "$dir/plan.err")"
/usr/bin/python3 - "$dir/plan.json" <<'PY' || failed=$((failed + 1))
import json, sys
d = json.load(open(sys.argv[1]))["device"]
assert d["name"] == "cuda:0", d
assert d["total_bytes"] == 512 << 20, d
# the warm-up's handles and job slots stay: the process holds something, less than the device
assert 0 < d["process_bytes"] < d["total_bytes"], d
assert d["free_bytes"] <= d["total_bytes"] - d["process_bytes"], d
print("plan: cuda:0 %d MiB, the process holds %.2f MiB" % (d["total_bytes"] >> 20,
      d["process_bytes"] / 1048576))
PY

# training: the same steps on the CPU and on the emulated GPU
"$ddpmd" train "$dir/spec.json" --out "$dir/cpu" > "$dir/cpu.log" 2> "$dir/cpu.err"
rc=$?
check '[ $rc -eq 0 ]' "cpu train: exit $rc, $(tail -n 3 "$dir/cpu.err")"
# (parity mode: training defaults to fast mode, whose TF32 operands the emulator rounds too)
cuda train "$dir/spec.json" --out "$dir/gpu" --device cuda:0 --deterministic > "$dir/gpu.log" \
    2> "$dir/gpu.err"
rc=$?
check '[ $rc -eq 0 ]' "cuda:0 train: exit $rc, $(tail -n 3 "$dir/gpu.err")"
/usr/bin/python3 - "$dir/cpu.log" "$dir/gpu.log" <<'PY' || failed=$((failed + 1))
import json, sys
def losses(path):
    ev = [json.loads(l) for l in open(path) if l.startswith("{")]
    return [(e["step"], e["loss"], e["grad_norm"]) for e in ev if e["event"] == "step"]
c, g = losses(sys.argv[1]), losses(sys.argv[2])
assert len(c) == 2 and [s for s, _, _ in c] == [s for s, _, _ in g], (c, g)
for (s, lc, nc), (_, lg, ng) in zip(c, g):
    # the emulator computes the kernels' arithmetic in other orders than the CPU backend
    assert abs(lc - lg) <= 1e-4 * max(1.0, abs(lc)), ("loss", s, lc, lg)
    assert abs(nc - ng) <= 1e-3 * max(1.0, abs(nc)), ("grad norm", s, nc, ng)
print("train: losses cpu %s, cuda:0 %s" % ([l for _, l, _ in c], [l for _, l, _ in g]))
PY
ck=$(printf "%s/gpu/checkpoints/step-%08d.safetensors" "$dir" 2)
check '[ -f "$ck" ] && ls "$dir"/gpu/samples/*.png > /dev/null 2>&1' \
      "cuda:0 train wrote no final checkpoint or sample grid"

# sampling from the emulated GPU's checkpoint, on both devices: the same images
"$ddpmd" sample "$ck" --n 2 --steps 3 --out "$dir/cpu.png" > /dev/null 2> "$dir/scpu.err"
rc1=$?
cuda sample "$ck" --n 2 --steps 3 --out "$dir/gpu.png" --device cuda:0 > /dev/null 2> "$dir/sgpu.err"
rc2=$?
check '[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]' "sample: exit $rc1 (cpu), $rc2 (cuda:0): $(cat "$dir/sgpu.err")"
/usr/bin/python3 - "$dir/cpu.png" "$dir/gpu.png" <<'PY' || failed=$((failed + 1))
import sys, zlib, struct
def pixels(path):
    """the 8-bit samples of a non-interlaced PNG (libpng's adaptive filters undone)"""
    b = open(path, "rb").read()
    assert b[:8] == b"\x89PNG\r\n\x1a\n", path
    i, idat = 8, b""
    while i < len(b):
        n, t = struct.unpack(">I4s", b[i:i + 8])
        if t == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", b[i + 8:i + 18])
        if t == b"IDAT": idat += b[i + 8:i + 8 + n]
        i += 12 + n
    assert depth == 8 and ctype in (0, 2), (depth, ctype)
    bpp = 1 if ctype == 0 else 3
    raw, stride, out, prev = zlib.decompress(idat), w * bpp, [], [0] * (w * bpp)
    for y in range(h):
        f, row = raw[y * (stride + 1)], list(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = row[x - bpp] if x >= bpp else 0
            c = prev[x - bpp] if x >= bpp else 0
            p = a + prev[x] - c
            pa, pb, pc = abs(p - a), abs(p - prev[x]), abs(p - c)
            pred = [0, a, prev[x], (a + prev[x]) // 2,
                    a if pa <= pb and pa <= pc else prev[x] if pb <= pc else c][f]
            row[x] = (row[x] + pred) & 255
        out += row
        prev = row
    return w, h, out
wc, hc, pc = pixels(sys.argv[1])
wg, hg, pg = pixels(sys.argv[2])
assert (wc, hc) == (wg, hg), (wc, hc, wg, hg)
diff = max(abs(a - b) for a, b in zip(pc, pg))
# 8-bit levels of images computed in float by two backends
assert diff <= 2, "the images differ by up to %d levels" % diff
assert max(pc) > min(pc), "a flat image proves nothing"
print("sample: %dx%d grid, cpu and cuda:0 within %d levels" % (wc, hc, diff))
PY

# a reservation larger than the device (64 MiB, 26 of them the process's own after the warm-up,
# the job ~70 MiB): refused before a step, with the bytes named
cat > "$dir/big.json" <<'JSON'
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 32, "block_out_channels": [64, 64],
             "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist" },
  "train": { "batch": 8, "steps": 2, "warmup": 0, "threads": 1 },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": 1 } }
JSON
EMU_DEVICE_MB=64 cuda train "$dir/big.json" --out "$dir/big" --device cuda:0 > "$dir/big.log" \
    2> "$dir/big.err"
rc=$?
check '[ $rc -eq 1 ] && grep -q "cannot reserve the plan.s [0-9]* bytes" "$dir/big.err"' \
      "a plan larger than the device: exit $rc, $(tail -n 2 "$dir/big.err")"
check '! grep -q "\"event\":\"step\"" "$dir/big.log"' "a step ran without its reservation"

# a sticky fault mid-step: the job fails with the error, the device is reported poisoned
EMU_FAULT_AT_LAUNCH=40 cuda train "$dir/spec.json" --out "$dir/fault" --device cuda:0 \
    > "$dir/fault.log" 2> "$dir/fault.err"
rc=$?
check '[ $rc -eq 3 ]' "a sticky fault: exit $rc, not 3"
check 'grep -q "training failed: .*device error" "$dir/fault.err"' \
      "the failure does not name the backend's error: $(grep failed "$dir/fault.err")"
check 'grep -q "cudaErrorIllegalAddress" "$dir/fault.err" && grep -q "cuda:0 is poisoned" "$dir/fault.err"' \
      "the fault or the poisoned device is not reported"
check 'tail -n 1 "$dir/fault.err" | grep -q "^ddpmd: device cuda:0 is poisoned: "' \
      "the last stderr line is not the poisoned device: $(tail -n 1 "$dir/fault.err")"

# memory.vram_budget with offload on: the plan under the budget on cuda:0, its losses the CPU's,
# and all the process held on the device its warm-up's bytes and then the plan's one reservation
sed 's/"output"/"memory": { "precision": "f32", "offload": "on", "vram_budget": 600000 },\n  "output"/' \
    "$dir/spec.json" > "$dir/off.json"
"$ddpmd" train "$dir/off.json" --out "$dir/ocpu" > "$dir/ocpu.log" 2> "$dir/ocpu.err"
rc1=$?
EMU_ALLOC_LOG="$dir/alloc.log" cuda train "$dir/off.json" --out "$dir/ogpu" --device cuda:0 \
    --deterministic > "$dir/ogpu.log" 2> "$dir/ogpu.err"
rc2=$?
check '[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]' "offload under a budget: exit $rc1 (cpu), $rc2 (cuda:0): $(tail -n 2 "$dir/ogpu.err")"
/usr/bin/python3 - "$dir/cpu.log" "$dir/ocpu.log" "$dir/ogpu.log" "$dir/ogpu.err" "$dir/plan.json" \
    "$dir/alloc.log" <<'PY' || failed=$((failed + 1))
import json, re, sys
def losses(path):
    ev = [json.loads(l) for l in open(path) if l.startswith("{")]
    return [(e["step"], e["loss"], e["grad_norm"]) for e in ev if e["event"] == "step"]
plain, c, g = losses(sys.argv[1]), losses(sys.argv[2]), losses(sys.argv[3])
assert len(g) == 2 and c == plain, (plain, c)  # offload on the CPU: the plain run's bits
for (s, lc, nc), (_, lg, ng) in zip(c, g):
    assert abs(lc - lg) <= 1e-4 * max(1.0, abs(lc)), ("loss", s, lc, lg)
    assert abs(nc - ng) <= 1e-3 * max(1.0, abs(nc)), ("grad norm", s, nc, ng)
err = open(sys.argv[4]).read()
total = int(re.search(r"device total +(\d+) bytes", err).group(1))
host = int(re.search(r"host total +(\d+) bytes", err).group(1))
assert total <= 600000 and host > 0, (total, host)
process = json.load(open(sys.argv[5]))["device"]["process_bytes"]
log = [l.split() for l in open(sys.argv[6])]
i = [k for k, l in enumerate(log) if l[0] == "malloc" and int(l[1]) == total]
assert len(i) == 1, ("the reservation's cudaMalloc", total, i)
i = i[0]
granule = 2 << 20
held_before, held = int(log[i - 1][2]) if i else 0, int(log[i][2])
assert held_before == process, ("held before the reservation", held_before, process)
assert held == process + (total + granule - 1) // granule * granule, (held, process, total)
after = [l for l in log[i + 1:] if l[0] == "malloc"]
assert not after, ("device allocations after the reservation", after)
pinned = [l for l in log if l[0] == "host" and int(l[1]) >= host]
assert len(pinned) == 1, ("the page-locked host block", host, pinned)
print("offload under a 600000-byte budget: plan %d bytes on cuda:0 (+%d host, page-locked), "
      "losses %s as the CPU's; the process held %.2f MiB (warm-up) + the reservation, nothing "
      "else" % (total, host, [l for _, l, _ in g], process / 1048576))
PY

# a budget no plan fits: refused before any step, the smallest budget named
cuda train "$dir/spec.json" --out "$dir/tiny" --device cuda:0 --vram-budget 100000 \
    > "$dir/tiny.log" 2> "$dir/tiny.err"
rc=$?
check '[ $rc -eq 1 ] && grep -q "training failed: no plan fits 0.1 MiB: the smallest needs" "$dir/tiny.err"' \
      "a budget no plan fits: exit $rc, $(tail -n 1 "$dir/tiny.err")"
check '! grep -q "\"event\":\"step\"" "$dir/tiny.log"' "a refused budget still ran a step"

# the same for sampling (also the proof that it ran on the emulated device)
EMU_FAULT_AT_LAUNCH=5 cuda sample "$ck" --n 2 --steps 3 --out "$dir/fault.png" --device cuda:0 \
    > /dev/null 2> "$dir/sfault.err"
rc=$?
check '[ $rc -eq 3 ] && grep -q "cuda:0 is poisoned" "$dir/sfault.err" && [ ! -e "$dir/fault.png" ]' \
      "a sticky fault while sampling: exit $rc, $(tail -n 2 "$dir/sfault.err")"

echo "test_cuda_emu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
