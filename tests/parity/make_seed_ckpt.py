#!/usr/bin/python3
"""Test helper: a small seed-preset UNet in PyTorch saved the way the original script saves it
(torch.save(model.state_dict(), DIR/ckpt.pt)), plus DIR/ref.safetensors with a fixed input x, t
and the model's output, so a C test can check that the converted weights reproduce it."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

out = sys.argv[1]
torch.manual_seed(3)
torch.set_num_threads(2)
cfg = dict(mf.SEED_FIXTURE, in_channels=1, out_channels=1)
model = mf.build_seed(cfg).eval()
torch.save(model.state_dict(), os.path.join(out, "ckpt.pt"))
x = torch.randn(2, 1, 16, 16)
t = torch.tensor([10.0, 500.0])
with torch.no_grad():
    y = model(x, t)
mf.write_safetensors(os.path.join(out, "ref.safetensors"), [("x", x), ("t", t), ("out", y)],
                     {"config": __import__("json").dumps(cfg)})
print("seed model", sum(p.numel() for p in model.parameters()), "parameters")
