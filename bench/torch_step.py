#!/usr/bin/python3
# torch_step.py - the PyTorch side of bench/cpu.sh: the same UNet (the parity fixtures' hand-written
# diffusers UNet2DModel and seed UNet, tests/parity/make_fixtures.py), the same training step
# (t and noise drawn, x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, forward, MSE against the
# noise, backward, clip 1.0, AdamW, EMA), float32 on the CPU, or with --precision bf16 the forward
# and the loss under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU mixed precision:
# convolutions and matmuls in bf16, fp32 weights and optimizer), timed like cpu_bench.
# --form picks how the model is written (bench/cpu_anchor.sh runs each on PyTorch 2.11):
#   script   the model as the users' scripts write it: the seed's nn.MultiheadAttention called
#            with its default need_weights=True (the L x L weights computed and averaged), the
#            ddpm presets' diffusers attention as baddbmm + softmax + bmm (AttnProcessor)
#   sdpa     the same weights through F.scaled_dot_product_attention (MultiheadAttention with
#            need_weights=False, diffusers' AttnProcessor2_0); torch >= 2.0
#   sdpa-cl  sdpa with the model and its input in channels_last
#   compile  sdpa-cl (or sdpa, --no-cl) through torch.compile (inductor's C++ backend); the
#            warm-up steps compile
# Prints `key value` lines. Debian's /usr/bin/python3 (python3-torch 1.13) runs the script form.
import argparse
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

# the process's peak RSS once torch is imported (a CUDA wheel maps its CUDA libraries)
IMPORT_RSS_KIB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import make_fixtures  # noqa: E402
from make_fixtures import SEED_FULL, build_ddpm, build_seed  # noqa: E402

FORMS = ["script", "sdpa", "sdpa-cl", "compile"]


def use_sdpa():
    """The parity models' attention through F.scaled_dot_product_attention: the seed's
    nn.MultiheadAttention with need_weights=False (its SDPA path), the ddpm presets' diffusers
    attention as AttnProcessor2_0 writes it. Same weights, same math."""

    def seed_forward(self, x):
        x = x.reshape(-1, self.channels, self.size * self.size).swapaxes(1, 2)
        x_ln = self.ln(x)
        a, _ = self.mha(x_ln, x_ln, x_ln, need_weights=False)
        a = a + x
        a = self.ff_self(a) + a
        return a.swapaxes(2, 1).reshape(-1, self.channels, self.size, self.size)

    def ddpm_forward(self, x):
        B, C, H, W = x.shape
        residual = x
        h = self.group_norm(x.reshape(B, C, H * W)).transpose(1, 2)
        q, k, v = self.to_q(h), self.to_k(h), self.to_v(h)

        def split(a):  # (B, HW, C) -> (B, heads, HW, hd)
            return a.reshape(B, H * W, self.heads, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=self.scale)
        o = o.transpose(1, 2).reshape(B, H * W, C)
        o = self.to_out[1](self.to_out[0](o))
        return o.transpose(-1, -2).reshape(B, C, H, W) + residual

    make_fixtures.SelfAttention.forward = seed_forward
    make_fixtures.Attention.forward = ddpm_forward

CONFIGS = {
    "fmnist-tiny": dict(in_channels=1, out_channels=1, block_out_channels=[32, 64, 64],
                        layers_per_block=1, attention_resolutions=[8], norm_num_groups=8),
    "cifar-small": dict(in_channels=3, out_channels=3, block_out_channels=[64, 128, 128, 128],
                        layers_per_block=2, attention_resolutions=[16], norm_num_groups=32),
    "ddpm-cifar10": dict(in_channels=3, out_channels=3, block_out_channels=[128, 256, 256, 256],
                         layers_per_block=2, attention_resolutions=[16], norm_num_groups=32),
    "seed-64": None,  # SEED_FULL: examples/seed-64.json
}


def train_step(model, opt, ema, x0, sqrt_ab, sqrt_1mab, g, amp=False, set_to_none=True,
               fwd=None, cl=False):
    """ddpmd's training step in PyTorch: t and noise drawn, q_sample, forward (bf16 autocast when
    amp; through fwd, e.g. a compiled model, when given; x_t channels_last when cl), MSE, backward,
    clip 1.0, AdamW, EMA 0.9999. Returns the loss."""
    opt.zero_grad(set_to_none=set_to_none)
    ti = torch.randint(0, 1000, (x0.shape[0],), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    xt = sqrt_ab[ti].view(-1, 1, 1, 1) * x0 + sqrt_1mab[ti].view(-1, 1, 1, 1) * noise
    if cl:
        xt = xt.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = F.mse_loss((model if fwd is None else fwd)(xt, ti.float()).float(), noise)
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
    ap.add_argument("--form", choices=FORMS, default="script")
    ap.add_argument("--no-cl", action="store_true", help="compile: without channels_last")
    a = ap.parse_args()
    amp = a.precision == "bf16"
    cl = a.form == "sdpa-cl" or (a.form == "compile" and not a.no_cl)
    if a.form != "script":
        use_sdpa()
    if amp and torch.__version__ < "2":
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
    if cl:
        model = model.to(memory_format=torch.channels_last)
    fwd = torch.compile(model) if a.form == "compile" else None
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(a.batch, cfg["in_channels"], S, S, generator=g)
    abar = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    sqrt_ab, sqrt_1mab = abar.sqrt().float(), (1.0 - abar).sqrt().float()

    times, cpus, first = [], [], None
    for s in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(model, opt, ema, x0, sqrt_ab, sqrt_1mab, g, amp=amp, fwd=fwd, cl=cl)
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
    print("precision %s\nform %s" % (a.precision, a.form + ("-nocl" if a.no_cl and a.form == "compile" else "")))
    print("cpu_capability %s" % (torch.backends.cpu.get_cpu_capability()
                                 if hasattr(torch.backends, "cpu") else "?"))
    print("steps %d\nwarmup %d\nstep_ms_median %.3f\nstep_ms_min %.3f\nstep_ms_max %.3f"
          % (a.steps, a.warmup, 1e3 * med, 1e3 * times[0], 1e3 * times[-1]))
    print("images_per_s %.3f" % (a.batch / med))
    cpus.sort()
    print("step_cpu_s_median %.3f" % (cpus[n // 2] if n % 2 else 0.5 * (cpus[n // 2 - 1] + cpus[n // 2])))
    print("peak_rss_kib %d" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print("import_rss_kib %d" % IMPORT_RSS_KIB)
    print("loss_first %.9g\nloss_last %.9g" % (first, loss.item()))


if __name__ == "__main__":
    main()
