#!/usr/bin/python3
"""Test helper: loads a `ddpmd export --diffusers DIR` result (a DDPMPipeline folder: its UNet in
DIR/unet) the way diffusers would -- UNet2DModel(**config.json) with load_state_dict(strict=True)
-- using the hand-written UNet2DModel of make_fixtures.py (same module tree and keys as
diffusers), runs it on the x, t of DIR/ref.safetensors and compares with ddpmd's output stored
there. Exit 0 when they agree."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

d = sys.argv[1]
u = os.path.join(d, "unet")
cfg = json.load(open(os.path.join(u, "config.json")))
assert cfg["_class_name"] == "UNet2DModel", cfg["_class_name"]
model = mf.UNet2DModel(cfg["in_channels"], cfg["out_channels"], cfg["block_out_channels"],
                       cfg["layers_per_block"], cfg["down_block_types"], cfg["up_block_types"],
                       cfg["norm_num_groups"], cfg["norm_eps"], cfg["attention_head_dim"],
                       cfg["dropout"], cfg["flip_sin_to_cos"], cfg["freq_shift"],
                       cfg["downsample_padding"]).eval()
meta, weights = mf.read_safetensors(os.path.join(u, "diffusion_pytorch_model.safetensors"))
assert meta.get("format") == "pt", meta
missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()},
                                            strict=True)
_, ref = mf.read_safetensors(os.path.join(d, "ref.safetensors"))
with torch.no_grad():
    y = model(torch.from_numpy(ref["x"].copy()), torch.from_numpy(ref["t"].copy())).numpy()
rel = float(((y - ref["out"]) ** 2).sum() ** 0.5 / (ref["out"] ** 2).sum() ** 0.5)
print(f"check_export: {len(weights)} tensors loaded strictly; output rel err {rel:.3g}")
sys.exit(0 if rel <= 1e-5 else 1)
