#!/usr/bin/python3
"""Converts a PyTorch checkpoint of the Diffusion-Models-pytorch UNet (the `seed` preset; the
script saves `torch.save(model.state_dict(), "ckpt.pt")`, and `ema_ckpt.pt` for its EMA model)
into a safetensors file that ddpmd reads: `init_from` in a spec, or `ddpmd sample --spec`.

usage: convert_seed_ckpt.py ckpt.pt out.safetensors [--ema ema_ckpt.pt]

Keys stay the script's state_dict keys (inc.double_conv.0.weight, sa1.mha.in_proj_weight, ...);
EMA weights, when given, are stored under "ema.<key>". A "module." prefix (DataParallel) and a
wrapping {"state_dict": ...} or {"model": ...} are removed. Needs torch (Debian python3-torch)."""
import json
import struct
import sys

import torch


def load_state_dict(path):
    sd = torch.load(path, map_location="cpu")
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        sys.exit(f"{path}: not a state_dict (got {type(sd).__name__})")
    out = {}
    for k, v in sd.items():
        if not torch.is_tensor(v):
            continue
        if k.startswith("module."):
            k = k[len("module."):]
        if not v.is_floating_point():
            continue  # e.g. BatchNorm counters; the seed UNet has none
        out[k] = v.detach().to(torch.float32).contiguous()
    if not out:
        sys.exit(f"{path}: no floating-point tensors")
    return out


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        b = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    import os
    os.replace(path + ".tmp", path)


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--ema"):
        sys.exit(__doc__)
    sd = load_state_dict(argv[1])
    tensors = sorted(sd.items())
    if len(argv) == 5:
        ema = load_state_dict(argv[4])
        if set(ema) != set(sd):
            sys.exit("the EMA checkpoint's keys differ from the model's")
        tensors += [("ema." + k, v) for k, v in sorted(ema.items())]
    write_safetensors(argv[2], tensors, {"format": "pt", "source": "Diffusion-Models-pytorch"})
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {argv[2]}: {len(sd)} tensors, {n} parameters"
          f"{' + EMA' if len(argv) == 5 else ''}")


if __name__ == "__main__":
    main(sys.argv)
