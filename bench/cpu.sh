#!/usr/bin/env bash
# cpu.sh - the CPU training-step benchmark: ddpmd against PyTorch (Debian's python3-torch, same
# model, same step: forward, MSE, backward, clip, AdamW, EMA) on this machine, in one run, plus
# the machine's ceilings (a large SGEMM and a 3x3 convolution forward + backward through
# oneDNN). Prints a markdown table. Each engine's time is the median over STEPS steps after
# WARMUP, measured ROUNDS times alternating ddpmd and torch; the faster round counts (these
# machines are shared: a round that met a noisy neighbour is discarded, for both engines alike).
# The seed preset at 64x64 (seed-64, examples/seed-64.json) takes seconds a step on 2 cores: it
# runs SEED_STEPS steps after SEED_WARMUP instead. Each config runs in every precision of
# PRECISIONS (f32 first): ddpmd's --precision against torch fp32 (f32) or torch.autocast("cpu",
# bfloat16) (bf16; torch has no CPU f16 autocast: f16 rows show ddpmd alone); "vs f32" is
# ddpmd's f32 row over this one (time and CPU seconds) for the same config and batch.
#   bash bench/cpu.sh                 # all five configs, f32 and bf16
#   CONFIGS="fmnist-tiny:32" STEPS=10 bash bench/cpu.sh
#   CONFIGS="fmnist-tiny:32 ddpm-cifar10:8" PRECISIONS="f32 bf16 f16" bash bench/cpu.sh
#   CONFIGS="seed-64:8" SEED_STEPS=3 ROUNDS=2 PRECISIONS=f32 bash bench/cpu.sh
# Not a test: it asserts nothing; ratios > 1 mean ddpmd is ahead.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-$(nproc)}
SEED_STEPS=${SEED_STEPS:-3}
SEED_WARMUP=${SEED_WARMUP:-1}
CONFIGS=${CONFIGS:-"seed-64:8 fmnist-tiny:8 fmnist-tiny:32 cifar-small:8 ddpm-cifar10:8"}
PRECISIONS=${PRECISIONS:-"f32 bf16"}
# ddpmd's own OpenMP wait policy (kernels/cpu/cpu.h, cpu_omp_wait_policy), torch's too: the same
# for both engines unless the environment names one
if [ -z "${OMP_WAIT_POLICY:-}" ]; then
  export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-3000}
fi

# the build users run (scripts/build.sh: build/, RelWithDebInfo)
bash scripts/build.sh >/dev/null
B=build/cpu_bench

have_torch=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then have_torch=1; fi

val() { awk -v k="$1" '$1 == k { print $2; exit }' <<<"$2"; }

echo "# ddpmd CPU benchmark"
echo
echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), $(nproc) cores," \
     "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo);" \
     "ISA: $(grep -o -w -m1 -E 'avx512f' /proc/cpuinfo | head -1 || true) $(grep -o -w -m1 avx2 /proc/cpuinfo | head -1) $(grep -o -w -m1 avx512_bf16 /proc/cpuinfo | head -1 || true) $(grep -o -w -m1 amx_bf16 /proc/cpuinfo | head -1 || true);" \
     "oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null || echo '?');" \
     "torch $( [ $have_torch = 1 ] && /usr/bin/python3 -c 'import torch; print(torch.__version__)' || echo 'absent');" \
     "threads $THREADS; median of $STEPS steps after $WARMUP warm-up (seed-64: $SEED_STEPS after $SEED_WARMUP), best of $ROUNDS alternating rounds"
# torch's matmuls run on this OpenBLAS; ddpmd's GEMMs on oneDNN (its own ISA detection)
tcore="absent"
if [ $have_torch = 1 ]; then
  tcore=$(OPENBLAS_VERBOSE=2 /usr/bin/python3 -c "import torch" 2>&1 | awk '/^Core:/ {print $2; exit}')
fi
echo "libblas.so.3 -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?');" \
     "its kernels for torch: ${tcore:-?}${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}${DNNL_MAX_CPU_ISA:+; DNNL_MAX_CPU_ISA=$DNNL_MAX_CPU_ISA}"
echo

ceil=$($B --ceilings --threads "$THREADS" --seconds 3)
sgemm=$(val ceiling_sgemm_gflops "$ceil")
convc=$(val ceiling_conv_gflops "$ceil")
echo "ceilings: SGEMM $(val ceiling_sgemm_shape "$ceil") $sgemm GFLOP/s;" \
     "conv $(val ceiling_conv_shape "$ceil") fwd $(val ceiling_conv_fwd_gflops "$ceil")," \
     "bwd-data $(val ceiling_conv_bwd_data_gflops "$ceil"), bwd-filter" \
     "$(val ceiling_conv_bwd_filter_gflops "$ceil"), all three $convc GFLOP/s (oneDNN);" \
     "the same in bf16: fwd $(val ceiling_conv_bf16_fwd_gflops "$ceil"), bwd-data" \
     "$(val ceiling_conv_bf16_bwd_data_gflops "$ceil"), bwd-filter" \
     "$(val ceiling_conv_bf16_bwd_filter_gflops "$ceil"), all three" \
     "$(val ceiling_conv_bf16_gflops "$ceil") GFLOP/s"
echo
echo "| config | batch | precision | ddpmd ms/step | torch ms/step | ddpmd img/s | torch img/s | speed ratio | ddpmd CPU s/step | torch CPU s/step | CPU ratio | ddpmd vs its f32 (time, CPU) | ddpmd GFLOP/s (% conv ceiling) | torch GFLOP/s | ddpmd peak RSS MiB | torch peak RSS MiB | RSS ratio | ddpmd plan MiB + overhead MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
fnv=""
for cb in $CONFIGS; do
 cfg=${cb%%:*}
 bs=${cb##*:}
 f32ms=""; f32cpu=""
 for prec in $PRECISIONS; do
  dms=""; tms=nan; tips=nan; trss=nan; dcpu=""; tcpu=nan
  st=$STEPS; wu=$WARMUP
  if [ "$cfg" = seed-64 ]; then st=$SEED_STEPS; wu=$SEED_WARMUP; fi
  for r in $(seq "$ROUNDS"); do
    d=$($B --config "$cfg" --batch "$bs" --steps "$st" --warmup "$wu" --threads "$THREADS" \
          --precision "$prec")
    m=$(val step_ms_median "$d")
    if [ -z "$dms" ] || awk -v a="$m" -v b="$dms" 'BEGIN { exit !(a < b) }'; then
      dms=$m
      dips=$(val images_per_s "$d")
      dgf=$(val gflops "$d")
    fi
    m=$(val step_cpu_s_median "$d")
    if [ -z "$dcpu" ] || awk -v a="$m" -v b="$dcpu" 'BEGIN { exit !(a < b) }'; then dcpu=$m; fi
    fnv="$fnv $cfg:$bs:$prec:$(val weights_fnv "$d")"
    gps=$(val gflop_per_step "$d")
    drss=$(val peak_rss_kib "$d")
    plan=$(val plan_bytes "$d")
    over=$(val overhead_kib "$d")
    if [ $have_torch = 1 ] && [ "$prec" != f16 ]; then
      t=$(/usr/bin/python3 bench/torch_step.py --config "$cfg" --batch "$bs" --steps "$st" \
            --warmup "$wu" --threads "$THREADS" --precision "$prec")
      m=$(val step_ms_median "$t")
      if [ "$tms" = nan ] || awk -v a="$m" -v b="$tms" 'BEGIN { exit !(a < b) }'; then
        tms=$m
        tips=$(val images_per_s "$t")
      fi
      trss=$(val peak_rss_kib "$t")
      m=$(val step_cpu_s_median "$t")
      if [ "$tcpu" = nan ] || awk -v a="$m" -v b="$tcpu" 'BEGIN { exit !(a < b) }'; then tcpu=$m; fi
    fi
  done
  if [ "$prec" = f32 ]; then f32ms=$dms; f32cpu=$dcpu; fi
  awk -v cfg="$cfg" -v bs="$bs" -v prec="$prec" -v dms="$dms" -v tms="$tms" -v dips="$dips" \
      -v tips="$tips" -v dgf="$dgf" -v gps="$gps" -v convc="$convc" -v drss="$drss" \
      -v trss="$trss" -v plan="$plan" -v over="$over" -v dcpu="$dcpu" -v tcpu="$tcpu" \
      -v f32ms="$f32ms" -v f32cpu="$f32cpu" 'BEGIN {
    tgf = (tms == "nan") ? "-" : sprintf("%.1f", gps / (tms / 1000));
    ratio = (tms == "nan") ? "-" : sprintf("**%.2fx**", tms / dms);
    rr = (trss == "nan") ? "-" : sprintf("%.2f", drss / trss);
    cr = (tcpu == "nan") ? "-" : sprintf("%.2fx", tcpu / dcpu);
    vs = (f32ms == "") ? "-" : sprintf("%.2fx, %.2fx", f32ms / dms, f32cpu / dcpu);
    printf "| %s | %s | %s | %.1f | %s | %.2f | %s | %s | %.2f | %s | %s | %s | %.1f (%.0f%%) | %s | %.0f | %s | %s | %.0f + %.0f |\n",
      cfg, bs, prec, dms, (tms == "nan") ? "-" : sprintf("%.1f", tms), dips,
      (tips == "nan") ? "-" : sprintf("%.2f", tips), ratio, dcpu,
      (tcpu == "nan") ? "-" : sprintf("%.2f", tcpu), cr, vs, dgf, 100 * dgf / convc, tgf,
      drss / 1024, (trss == "nan") ? "-" : sprintf("%.0f", trss / 1024), rr,
      plan / 1048576, over / 1024 }'
 done
done
echo
echo "speed ratio = torch ms/step / ddpmd ms/step (images/s ratio) in the row's precision (torch bf16:"
echo "autocast); CPU s/step = CPU seconds of all threads per step (least of the rounds), CPU ratio ="
echo "torch / ddpmd; ddpmd vs its f32 = ddpmd's f32 row / this row (> 1: faster); RSS ratio = ddpmd / torch;"
echo "GFLOP/s count convolutions, linears and attention matmuls of the step (same count for both)."
echo "ddpmd weights after each round (equal within a config: the same bits at $THREADS threads):$fnv"
