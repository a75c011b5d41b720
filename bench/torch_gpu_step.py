#!/usr/bin/env python3
# torch_gpu_step.py - the PyTorch side of the GPU benchmark (bench/gpu.sh, tests/gpu/check.sh): the
# model of a ddpmd spec file (examples/*.json) written out as the parity fixtures' modules
# (tests/parity/make_fixtures.py: diffusers' UNet2DModel and the seed UNet), the same training step
# as bench/gpu_bench.c (a fixed batch x_t, forward, MSE against the noise, backward, clip, AdamW,
# EMA) in one of three modes:
#   eager-fp32    float32, NCHW, the fixtures' attention (bmm + softmax)
#   amp-bf16      torch.autocast bfloat16, channels_last, F.scaled_dot_product_attention
#   compile-bf16  amp-bf16 under torch.compile
# Prints `key value` lines (images/s, peak memory: torch.cuda.max_memory_allocated on a GPU, the
# peak RSS on the CPU; on a GPU also the process's own bytes beside its caching allocator's after
# the run). A mode this torch cannot run prints "unavailable REASON" and exits 3.
#   torch_gpu_step.py --spec SPEC.json [--batch N] [--steps N] [--warmup N] [--mode M] [--device D]
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import make_fixtures as mf  # noqa: E402

MODES = ("eager-fp32", "amp-bf16", "compile-bf16")


def model_config(spec):
    m = spec["model"]
    if m.get("preset", "ddpm") == "seed":
        cfg = dict(mf.SEED_FULL)
        for k in ("in_channels", "image_size", "base", "time_dim", "heads"):
            if k in m:
                cfg[k] = m[k]
        cfg["out_channels"] = cfg["in_channels"]
        return cfg
    cfg = dict(mf.DDPM_CIFAR10)
    for k in ("in_channels", "image_size", "block_out_channels", "layers_per_block",
              "attention_resolutions", "norm_num_groups", "norm_eps", "attention_head_dim",
              "dropout", "flip_sin_to_cos", "freq_shift"):
        if k in m:
            cfg[k] = m[k]
    cfg["out_channels"] = cfg["in_channels"]
    return cfg


def ddpm_attention_sdpa(self, x):
    """mf.Attention.forward with F.scaled_dot_product_attention (and reshape: channels_last)"""
    B, C, H, W = x.shape
    h = self.group_norm(x.reshape(B, C, H * W)).transpose(1, 2)
    q, k, v = self.to_q(h), self.to_k(h), self.to_v(h)

    def split(a):  # (B, HW, C) -> (B, heads, HW, hd)
        return a.reshape(B, H * W, self.heads, self.head_dim).transpose(1, 2)
    o = F.scaled_dot_product_attention(split(q), split(k), split(v))  # scale 1/sqrt(head_dim)
    o = o.transpose(1, 2).reshape(B, H * W, C)
    o = self.to_out[1](self.to_out[0](o))
    return o.transpose(-1, -2).reshape(B, C, H, W) + x


def seed_attention_sdpa(self, x):
    """mf.SelfAttention.forward without the attention weights: MultiheadAttention's SDPA path"""
    x = x.reshape(-1, self.channels, self.size * self.size).swapaxes(1, 2)
    x_ln = self.ln(x)
    a, _ = self.mha(x_ln, x_ln, x_ln, need_weights=False)
    a = a + x
    a = self.ff_self(a) + a
    return a.swapaxes(2, 1).reshape(-1, self.channels, self.size, self.size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--mode", choices=MODES, default="eager-fp32")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    spec = json.load(open(a.spec))
    tr = spec.get("train", {})
    batch = a.batch or tr.get("batch", 8)
    lr, clip, decay = tr.get("lr", 1e-4), tr.get("clip", 1.0), tr.get("ema_decay", 0.9999)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("unavailable no CUDA device for torch %s" % torch.__version__)
        return 3
    amp = a.mode != "eager-fp32"
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if a.mode == "compile-bf16" and not hasattr(torch, "compile"):
        print("unavailable torch.compile (torch %s)" % torch.__version__)
        return 3
    if amp and has_sdpa:
        mf.Attention.forward = ddpm_attention_sdpa
        mf.SelfAttention.forward = seed_attention_sdpa

    torch.manual_seed(0)
    cfg = model_config(spec)
    model = (mf.build_seed(cfg) if cfg["preset"] == "seed" else mf.build_ddpm(cfg)).float().to(dev)
    fmt = torch.channels_last if amp else torch.contiguous_format
    model = model.to(memory_format=fmt)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    S, C = cfg["image_size"], cfg["in_channels"]
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(batch, C, S, S, generator=g)
    noise = torch.randn(batch, C, S, S, generator=g)
    ti = torch.randint(0, 1000, (batch,), generator=g)
    abar = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    xt = (abar[ti].sqrt().float().view(-1, 1, 1, 1) * x0 +
          (1 - abar[ti]).sqrt().float().view(-1, 1, 1, 1) * noise)
    xt = xt.to(dev).contiguous(memory_format=fmt)
    noise = noise.to(dev).contiguous(memory_format=fmt)
    tf = ti.float().to(dev)
    fwd = torch.compile(model) if a.mode == "compile-bf16" else model

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = fwd(xt, tf)
        loss = F.mse_loss(out.float(), noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        with torch.no_grad():
            torch._foreach_mul_(ema, decay)
            torch._foreach_add_(ema, [p.detach() for p in params], alpha=1 - decay)
        return loss

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t_compile = time.perf_counter()
    first = None
    try:
        for _ in range(max(a.warmup, 1)):
            loss = step()
            first = first if first is not None else loss.item()
        sync()
    except RuntimeError as e:  # e.g. torch 1.13's CPU group_norm under bf16 autocast
        print("unavailable %s on %s (torch %s): %s" % (a.mode, dev, torch.__version__,
                                                        str(e).splitlines()[0][:160]))
        return 3
    t_compile = time.perf_counter() - t_compile
    times = []
    t_all = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    t_all = time.perf_counter() - t_all
    last = loss.item()
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    print("engine torch\nmode %s\nspec %s\ndevice %s\nbatch %d" % (a.mode, a.spec, dev, batch))
    if dev.type == "cuda":
        print("device_name %s" % torch.cuda.get_device_name(dev))
    print("torch_version %s\nsdpa %d" % (torch.__version__, int(amp and has_sdpa)))
    print("params %d" % sum(p.numel() for p in params))
    print("steps %d\nwarmup %d\nwarmup_s %.3f" % (a.steps, a.warmup, t_compile))
    print("step_ms_median %.3f\nstep_ms_min %.3f\nstep_ms_mean %.3f"
          % (1e3 * med, 1e3 * times[0], 1e3 * t_all / a.steps))
    print("images_per_s %.3f" % (batch * a.steps / t_all))
    if dev.type == "cuda":
        print("peak_bytes %d" % torch.cuda.max_memory_allocated(dev))
        print("peak_reserved_bytes %d" % torch.cuda.max_memory_reserved(dev))
        # what the process holds besides its caching allocator's memory: context, cuBLAS/cuDNN
        # handles and workspaces, loaded kernels (the device's other users would count too)
        free_b, total_b = torch.cuda.mem_get_info(dev)
        print("process_bytes %d" % (total_b - free_b - torch.cuda.memory_reserved(dev)))
    else:
        print("peak_bytes %d" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    print("loss_first %.9g\nloss_last %.9g" % (first if first is not None else last, last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
