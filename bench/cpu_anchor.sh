#!/usr/bin/env bash
# cpu_anchor.sh - ddpmd against the PyTorch a CPU user installs today (issue 25): PyTorch 2.11 from
# PyPI in a venv of its own, in each of its CPU forms, and Debian's python3-torch 1.13 as a second
# column, on every preset, in one run. Not a test and not a CI step: it asserts nothing.
#   forms (bench/torch_step.py --form): script f32 (the users' scripts as written: the seed's
#   nn.MultiheadAttention with its weights), sdpa f32 (scaled_dot_product_attention), sdpa-cl bf16
#   (torch.autocast("cpu", bfloat16) + channels_last + SDPA), compile bf16 (torch.compile of that)
#   ddpmd: f32, and bf16 (`memory.precision: bf16`, for a user who allows 16-bit)
# Each engine/form runs one process per round, ROUNDS rounds alternating over all of them (on a
# shared machine a round that met a noisy neighbour is discarded for all alike); a row's figures
# are its best round's: the median step of that round (ms/step), the CPU seconds of all its threads
# per step, the process's peak RSS, and for torch the RSS right after `import torch` (a PyPI wheel
# is the CUDA build: `import torch` maps its CUDA libraries; there is no CPU-only wheel on PyPI).
#   bash bench/cpu_anchor.sh
#   CONFIGS="fmnist-tiny:32" ROUNDS=3 bash bench/cpu_anchor.sh
#   DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 bash bench/cpu_anchor.sh   # the AVX2 cap
# The venv (TORCH_VENV, default build/torch211; ~4.7 GB with the CUDA packages pip brings) is made
# and filled on first use: `pip install torch==2.11.*` (TORCH_SPEC) from PyPI, and numpy.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
SEED_STEPS=${SEED_STEPS:-2}
SEED_WARMUP=${SEED_WARMUP:-1}
COMPILE_WARMUP=${COMPILE_WARMUP:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}  # seconds per process; one over it counts as failed (torch.compile
                                  # of fmnist-tiny b8 had not finished in 900 s at load ~20 here)
CONFIGS=${CONFIGS:-"seed-64:8 ddpm-cifar10:8 fmnist-tiny:32 cifar-small:8"}
FORMS=${FORMS:-"ddpmd:f32 ddpmd:bf16 torch:script:f32 torch:sdpa:f32 torch:sdpa-cl:bf16 torch:compile:bf16 debian:script:f32"}
TORCH_VENV=${TORCH_VENV:-build/torch211}
TORCH_SPEC=${TORCH_SPEC:-torch==2.11.*}
RAW=${RAW:-}  # a file to keep every process's output in
if [ -z "${OMP_WAIT_POLICY:-}" ]; then # ddpmd's policy (cpu_omp_wait_policy), for every engine
  export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-3000}
fi

bash scripts/build.sh >/dev/null
B=build/cpu_bench
if [ ! -x "$TORCH_VENV/bin/python" ] || ! "$TORCH_VENV/bin/python" -c "import torch, numpy" 2>/dev/null; then
  /usr/bin/python3 -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/pip" install -q "$TORCH_SPEC" numpy >&2
fi
TP=$TORCH_VENV/bin/python
have_debian=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then have_debian=1; fi

val() { awk -v k="$1" '$1 == k { print $2; exit }' <<<"$2"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

echo "# ddpmd against PyTorch 2.11 (PyPI) on the CPU"
echo
echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), $(nproc) cores;" \
     "ISA: $(grep -o -w -m1 -E 'avx512f' /proc/cpuinfo | head -1 || true) $(grep -o -w -m1 avx512_bf16 /proc/cpuinfo | head -1 || true) $(grep -o -w -m1 amx_bf16 /proc/cpuinfo | head -1 || true);" \
     "oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null || echo '?');" \
     "torch $($TP -c 'import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())')," \
     "Debian's $( [ $have_debian = 1 ] && /usr/bin/python3 -c 'import torch; print(torch.__version__)' || echo 'absent');" \
     "threads $THREADS${DNNL_MAX_CPU_ISA:+; DNNL_MAX_CPU_ISA=$DNNL_MAX_CPU_ISA}${ATEN_CPU_CAPABILITY:+ ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY}"
echo "median of $STEPS steps after $WARMUP warm-up (seed-64: $SEED_STEPS after $SEED_WARMUP; compile: $COMPILE_WARMUP warm-up), best of $ROUNDS alternating rounds; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

# run one engine/form of config cfg at batch bs; prints its output (key value lines) or nothing
run_one() {
  local cfg=$1 bs=$2 form=$3 st=$4 wu=$5
  local eng=${form%%:*} rest=${form#*:}
  case $eng in
    ddpmd) timeout "$RUN_TIMEOUT" $B --config "$cfg" --batch "$bs" --steps "$st" --warmup "$wu" --threads "$THREADS" \
             --precision "$rest" 2>/dev/null || true ;;
    torch|debian)
      local py=$TP f=${rest%%:*} prec=${rest##*:}
      if [ "$eng" = debian ]; then [ $have_debian = 1 ] || return 0; py=/usr/bin/python3; fi
      if [ "$f" = compile ] && [ "$wu" -lt "$COMPILE_WARMUP" ]; then wu=$COMPILE_WARMUP; fi
      timeout "$RUN_TIMEOUT" $py bench/torch_step.py --config "$cfg" --batch "$bs" --steps "$st" --warmup "$wu" \
        --threads "$THREADS" --precision "$prec" --form "$f" 2>/dev/null || true ;;
  esac
}

declare -A BEST CPU RSS IRSS
for cb in $CONFIGS; do
  cfg=${cb%%:*}; bs=${cb##*:}
  st=$STEPS; wu=$WARMUP
  if [ "$cfg" = seed-64 ]; then st=$SEED_STEPS; wu=$SEED_WARMUP; fi
  for r in $(seq "$ROUNDS"); do
    for form in $FORMS; do
      out=$(run_one "$cfg" "$bs" "$form" "$st" "$wu")
      if [ -n "$RAW" ]; then { echo "## $cfg $bs $form round $r load $(cut -d' ' -f1 /proc/loadavg)"; echo "$out"; } >>"$RAW"; fi
      m=$(val step_ms_median "$out")
      [ -n "$m" ] || continue
      k="$cb $form"
      if [ -z "${BEST[$k]:-}" ] || lt "$m" "${BEST[$k]}"; then BEST[$k]=$m; fi
      c=$(val step_cpu_s_median "$out")
      if [ -z "${CPU[$k]:-}" ] || lt "$c" "${CPU[$k]}"; then CPU[$k]=$c; fi
      RSS[$k]=$(val peak_rss_kib "$out")
      IRSS[$k]=$(val import_rss_kib "$out")
    done
  done
done

echo "| config | batch | engine | form | precision | ms/step | CPU s/step | peak RSS MiB | RSS after import MiB | torch 2.11's fastest / this | this RSS / fastest torch 2.11's |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for cb in $CONFIGS; do
  cfg=${cb%%:*}; bs=${cb##*:}
  fast=""; fastk=""
  for form in $FORMS; do
    k="$cb $form"
    [[ $form == torch:* ]] || continue
    [ -n "${BEST[$k]:-}" ] || continue
    if [ -z "$fast" ] || lt "${BEST[$k]}" "$fast"; then fast=${BEST[$k]}; fastk=$k; fi
  done
  for form in $FORMS; do
    k="$cb $form"
    eng=${form%%:*}; rest=${form#*:}
    f=ddpmd; prec=$rest
    if [ "$eng" != ddpmd ]; then f=${rest%%:*}; prec=${rest##*:}; fi
    name=$eng; [ "$eng" = torch ] && name="torch 2.11"; [ "$eng" = debian ] && name="torch 1.13 (Debian)"
    if [ -z "${BEST[$k]:-}" ]; then
      echo "| $cfg | $bs | $name | $f | $prec | failed | - | - | - | - | - |"
      continue
    fi
    awk -v cfg="$cfg" -v bs="$bs" -v name="$name" -v f="$f" -v prec="$prec" -v ms="${BEST[$k]}" \
        -v cpu="${CPU[$k]}" -v rss="${RSS[$k]}" -v irss="${IRSS[$k]:-}" -v fast="$fast" \
        -v frss="${RSS[$fastk]:-}" -v isfast="$([ "$k" = "$fastk" ] && echo 1 || echo 0)" 'BEGIN {
      sp = (fast == "") ? "-" : sprintf("%.2fx", fast / ms);
      if (name == "ddpmd") sp = "**" sp "**";
      if (isfast == "1") sp = sp " (fastest)";
      rr = (frss == "") ? "-" : sprintf("%.2f", rss / frss);
      printf "| %s | %s | %s | %s | %s | %.1f | %.2f | %.0f | %s | %s | %s |\n", cfg, bs, name, f,
        prec, ms, cpu, rss / 1024, (irss == "") ? "-" : sprintf("%.0f", irss / 1024), sp, rr }'
  done
done
echo
echo "torch 2.11's fastest / this: > 1 means this row is faster than PyTorch 2.11's fastest form of the"
echo "config; RSS / fastest: this row's peak RSS over that form's (torch's includes its import, see the column)."
