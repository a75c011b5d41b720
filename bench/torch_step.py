#!/usr/bin/python3
# torch_step.py - the PyTorch side of bench/cpu.sh: the same UNet (the parity fixtures' hand-written
# diffusers UNet2DModel and seed UNet, tests/parity/make_fixtures.py), the same training step
# (t and noise drawn, x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, forward, MSE against the
# noise, backward, clip 1.0, AdamW, EMA), float32 on the CPU, or with --precision bf16 the forward
# and the loss under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU mixed precision:
# convolutions and matmuls in bf16, fp32 weights and optimizer), timed like cpu_bench.
# Prints `key value` lines. Run with Debian's /usr/bin/python3 (python3-torch).
import argparse
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from make_fixtures import SEED_FULL, build_ddpm, build_seed  # noqa: E402

CONFIGS = {
    "fmnist-tiny": dict(in_channels=1, out_channels=1, block_out_channels=[32, 64, 64],
                        layers_per_block=1, attention_resolutions=[8], norm_num_groups=8),
    "cifar-small": dict(in_channels=3, out_channels=3, block_out_channels=[64, 128, 128, 128],
                        layers_per_block=2, attention_resolutions=[16], norm_num_groups=32),
    "ddpm-cifar10": dict(in_channels=3, out_channels=3, block_out_channels=[128, 256, 256, 256],
                         layers_per_block=2, attention_resolutions=[16], norm_num_groups=32),
    "seed-64": None,  # SEED_FULL: examples/seed-64.json
}


def train_step(model, opt, ema, x0, sqrt_ab, sqrt_1mab, g, amp=False, set_to_none=True):
    """ddpmd's training step in PyTorch: t and noise drawn, q_sample, forward (bf16 autocast when
    amp), MSE, backward, clip 1.0, AdamW, EMA 0.9999. Returns the loss."""
    opt.zero_grad(set_to_none=set_to_none)
    ti = torch.randint(0, 1000, (x0.shape[0],), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    xt = sqrt_ab[ti].view(-1, 1, 1, 1) * x0 + sqrt_1mab[ti].view(-1, 1, 1, 1) * noise
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = F.mse_loss(model(xt, ti.float()).float(), noise)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    with torch.no_grad():
        torch._foreach_mul_(ema, 0.9999)
        torch._foreach_add_(ema, [p.detach() for p in model.parameters()], alpha=1 - 0.9999)
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args()
    amp = a.precision == "bf16"
    if amp:
        # torch 1.13's CPU autocast leaves group_norm out of its fp32 list and then refuses a bf16
        # input with fp32 affine weights; later versions run it in fp32, as ddpmd does (fp32
        # statistics): do that here
        gn_forward = torch.nn.GroupNorm.forward

        def gn_fp32(self, x):
            with torch.autocast("cpu", enabled=False):
                return gn_forward(self, x.float())

        torch.nn.GroupNorm.forward = gn_fp32

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if CONFIGS[a.config] is None:
        cfg = dict(SEED_FULL)
        model = build_seed(cfg).float()
    else:
        cfg = dict(image_size=32, norm_eps=1e-6, attention_head_dim=None, dropout=0.0,
                   flip_sin_to_cos=False, freq_shift=1, **CONFIGS[a.config])
        model = build_ddpm(cfg).float()
    S = cfg["image_size"]
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(a.batch, cfg["in_channels"], S, S, generator=g)
    abar = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    sqrt_ab, sqrt_1mab = abar.sqrt().float(), (1.0 - abar).sqrt().float()

    times, cpus, first = [], [], None
    for s in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(model, opt, ema, x0, sqrt_ab, sqrt_1mab, g, amp=amp)
        t1, c1 = time.perf_counter(), time.process_time()
        if first is None:
            first = loss.item()
        if s >= a.warmup:
            times.append(t1 - t0)
            cpus.append(c1 - c0)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    print("engine torch\nconfig %s\nbatch %d\nthreads %d" % (a.config, a.batch, torch.get_num_threads()))
    print("params %d" % sum(p.numel() for p in model.parameters()))
    print("torch_version %s" % torch.__version__)
    print("precision %s" % a.precision)
    print("steps %d\nwarmup %d\nstep_ms_median %.3f\nstep_ms_min %.3f\nstep_ms_max %.3f"
          % (a.steps, a.warmup, 1e3 * med, 1e3 * times[0], 1e3 * times[-1]))
    print("images_per_s %.3f" % (a.batch / med))
    cpus.sort()
    print("step_cpu_s_median %.3f" % (cpus[n // 2] if n % 2 else 0.5 * (cpus[n // 2 - 1] + cpus[n // 2])))
    print("peak_rss_kib %d" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print("loss_first %.9g\nloss_last %.9g" % (first, loss.item()))


if __name__ == "__main__":
    main()
