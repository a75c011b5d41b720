#!/usr/bin/python3
# torch_mem.py - PyTorch's peak memory for one training step of the seed-64 case (bench/plan.sh;
# not a test): the seed UNet of tests/parity/make_fixtures.py (examples/seed-64.json) at a batch,
# the step of bench/torch_step.py (x_t drawn, forward, MSE, backward, clip 1.0, AdamW, EMA) in
# float32 on the CPU. After warm-up steps (gradients and AdamW state exist), one step runs under
# torch.profiler with profile_memory: the peak of the running sum of its ops' allocations and
# releases is what the step needs beyond what persists, and what persists is counted from the tensors
# (weights, gradients, AdamW moments, EMA). Prints `key value` lines (bytes). Run with Debian's
# /usr/bin/python3 (python3-torch).
import argparse
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from make_fixtures import SEED_FULL, build_seed  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import train_step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = dict(SEED_FULL)
    model = build_seed(cfg).float()
    S = cfg["image_size"]
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(a.batch, cfg["in_channels"], S, S, generator=g)
    abar = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    sqrt_ab, sqrt_1mab = abar.sqrt().float(), (1.0 - abar).sqrt().float()

    def step():  # the gradients stay allocated between steps, as ddpmd's do
        train_step(model, opt, ema, x0, sqrt_ab, sqrt_1mab, g, set_to_none=False)

    for _ in range(a.warmup):
        step()

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    params = list(model.parameters())
    persist = {
        "weights": nbytes(params),
        "gradients": nbytes(p.grad for p in params),
        "optimizer": sum(nbytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                         for st in opt.state.values()),
        "ema": nbytes(ema),
    }
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step()
    # every event's own allocations less its releases (an op's self memory; '[memory]' events
    # outside any op) in time order: the running sum's peak, at op granularity (a buffer an op
    # allocates and frees inside itself is not seen)
    mem = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
           if e.self_cpu_memory_usage]
    mem.sort()
    live = peak = 0
    for _, d in mem:
        live += d
        peak = max(peak, live)
    print("config seed-64\nbatch %d\nthreads %d\ntorch_version %s"
          % (a.batch, torch.get_num_threads(), torch.__version__))
    for k, v in persist.items():
        print("persistent_%s_bytes %d" % (k, v))
    print("persistent_bytes %d" % sum(persist.values()))
    print("step_peak_bytes %d" % peak)
    print("memory_events %d" % len(mem))
    print("peak_bytes %d" % (sum(persist.values()) + peak))
    print("peak_rss_kib %d" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


if __name__ == "__main__":
    main()
