#!/usr/bin/python3
# Generates the PyTorch parity fixtures for the two UNet presets (`ddpm`, `seed`): a short
# float32 CPU training run per preset, dumped to tests/parity/fixtures/<preset>.safetensors.
# Run with Debian's /usr/bin/python3 (torch 1.13, numpy); no diffusers needed. See README.md.

import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "fixtures")

SEED = 1234          # torch.manual_seed before building each model
DATA_SEED = 5678     # generator for x0 / t / noise (same batches for both presets)
STEPS = 10
BATCH = 2

TRAIN = {
    "T": 1000, "beta_start": 1e-4, "beta_end": 0.02, "batch": BATCH, "steps": STEPS,
    "lr": 1e-3, "warmup": 3, "schedule": "cosine", "beta1": 0.9, "beta2": 0.999,
    "eps": 1e-8, "weight_decay": 0.01, "clip": None, "ema_decay": 0.9,
}


# ---------------------------------------------------------------------------------------------
# Preset "ddpm": diffusers UNet2DModel, written out by hand with diffusers' attribute names.

def ddpm_timestep_embedding(t, ch, flip_sin_to_cos, freq_shift):
    # diffusers get_timestep_embedding, except the frequency table is computed in float64 and
    # rounded once to float32 (the C engine does the same; keeps the fixture libm-independent).
    half = ch // 2
    exponent = (-math.log(10000.0) * torch.arange(half, dtype=torch.float64, device=t.device)
                / (half - freq_shift))
    freqs = torch.exp(exponent).to(torch.float32)
    emb = t[:, None].to(torch.float32) * freqs[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return emb


class TimestepEmbedding(nn.Module):
    def __init__(self, in_ch, time_embed_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_ch, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class ResnetBlock2D(nn.Module):
    # registration order as in diffusers: norm1, conv1, time_emb_proj, norm2, dropout, conv2,
    # nonlinearity, conv_shortcut
    def __init__(self, in_ch, out_ch, temb_ch, groups, eps, dropout):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=1, padding=1)
        self.time_emb_proj = nn.Linear(temb_ch, out_ch)
        self.norm2 = nn.GroupNorm(groups, out_ch, eps=eps, affine=True)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1)
        self.nonlinearity = nn.SiLU()
        self.conv_shortcut = nn.Conv2d(in_ch, out_ch, 1, stride=1, padding=0) if in_ch != out_ch else None

    def forward(self, x, temb):
        h = self.conv1(self.nonlinearity(self.norm1(x)))
        h = h + self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        h = self.conv2(self.dropout(self.nonlinearity(self.norm2(h))))
        sc = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return (sc + h) / 1.0  # output_scale_factor = 1


class Attention(nn.Module):
    # diffusers Attention(..., residual_connection=True, upcast_softmax=True,
    # _from_deprecated_attn_block=True) with the classic AttnProcessor.
    def __init__(self, ch, head_dim, groups, eps):
        super().__init__()
        self.heads = ch // head_dim
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.group_norm = nn.GroupNorm(groups, ch, eps=eps, affine=True)
        self.to_q = nn.Linear(ch, ch, bias=True)
        self.to_k = nn.Linear(ch, ch, bias=True)
        self.to_v = nn.Linear(ch, ch, bias=True)
        self.to_out = nn.ModuleList([nn.Linear(ch, ch, bias=True), nn.Dropout(0.0)])

    def forward(self, x):
        B, C, H, W = x.shape
        residual = x
        h = self.group_norm(x.view(B, C, H * W)).transpose(1, 2)            # (B, HW, C)
        q, k, v = self.to_q(h), self.to_k(h), self.to_v(h)

        def split(a):  # (B, HW, C) -> (B*heads, HW, hd)
            return a.reshape(B, H * W, self.heads, self.head_dim).permute(0, 2, 1, 3) \
                    .reshape(B * self.heads, H * W, self.head_dim)
        q, k, v = split(q), split(k), split(v)
        scores = torch.baddbmm(torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype),
                               q, k.transpose(-1, -2), beta=0, alpha=self.scale)
        probs = scores.float().softmax(dim=-1)
        o = torch.bmm(probs, v)                                              # (B*heads, HW, hd)
        o = o.reshape(B, self.heads, H * W, self.head_dim).permute(0, 2, 1, 3).reshape(B, H * W, C)
        o = self.to_out[1](self.to_out[0](o))
        o = o.transpose(-1, -2).reshape(B, C, H, W)
        return (o + residual) / 1.0  # rescale_output_factor = 1


class Downsample2D(nn.Module):
    def __init__(self, ch, padding):
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=padding)

    def forward(self, x):
        if self.padding == 0:
            x = F.pad(x, (0, 1, 0, 1), mode="constant", value=0)
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock(nn.Module):  # DownBlock2D / AttnDownBlock2D
    def __init__(self, in_ch, out_ch, temb_ch, num_layers, attn, head_dim, groups, eps, dropout,
                 add_downsample, downsample_padding):
        super().__init__()
        resnets, attentions = [], []
        for i in range(num_layers):
            resnets.append(ResnetBlock2D(in_ch if i == 0 else out_ch, out_ch, temb_ch, groups, eps, dropout))
            if attn:
                attentions.append(Attention(out_ch, head_dim, groups, eps))
        if attn:  # diffusers registers attentions before resnets in the Attn blocks
            self.attentions = nn.ModuleList(attentions)
        self.resnets = nn.ModuleList(resnets)
        self.downsamplers = nn.ModuleList([Downsample2D(out_ch, downsample_padding)]) if add_downsample else None
        self.has_attn = attn

    def forward(self, x, temb):
        outs = ()
        for j, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.has_attn:
                x = self.attentions[j](x)
            outs += (x,)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            outs += (x,)
        return x, outs


class UpBlock(nn.Module):  # UpBlock2D / AttnUpBlock2D
    def __init__(self, in_ch, prev_out_ch, out_ch, temb_ch, num_layers, attn, head_dim, groups, eps,
                 dropout, add_upsample):
        super().__init__()
        resnets, attentions = [], []
        for i in range(num_layers):
            res_skip = in_ch if i == num_layers - 1 else out_ch
            res_in = prev_out_ch if i == 0 else out_ch
            resnets.append(ResnetBlock2D(res_in + res_skip, out_ch, temb_ch, groups, eps, dropout))
            if attn:
                attentions.append(Attention(out_ch, head_dim, groups, eps))
        if attn:
            self.attentions = nn.ModuleList(attentions)
        self.resnets = nn.ModuleList(resnets)
        self.upsamplers = nn.ModuleList([Upsample2D(out_ch)]) if add_upsample else None
        self.has_attn = attn

    def forward(self, x, res_tuple, temb):
        for j, resnet in enumerate(self.resnets):
            res = res_tuple[-1]
            res_tuple = res_tuple[:-1]
            x = torch.cat([x, res], dim=1)  # hidden first, skip second
            x = resnet(x, temb)
            if self.has_attn:
                x = self.attentions[j](x)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class UNetMidBlock2D(nn.Module):
    def __init__(self, ch, temb_ch, head_dim, groups, eps, dropout):
        super().__init__()
        resnets = [ResnetBlock2D(ch, ch, temb_ch, groups, eps, dropout)]
        attentions = [Attention(ch, head_dim, groups, eps)]
        resnets.append(ResnetBlock2D(ch, ch, temb_ch, groups, eps, dropout))
        self.attentions = nn.ModuleList(attentions)
        self.resnets = nn.ModuleList(resnets)

    def forward(self, x, temb):
        x = self.resnets[0](x, temb)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            x = resnet(attn(x), temb)
        return x


class UNet2DModel(nn.Module):
    def __init__(self, in_channels, out_channels, block_out_channels, layers_per_block,
                 down_block_types, up_block_types, norm_num_groups, norm_eps, attention_head_dim,
                 dropout, flip_sin_to_cos, freq_shift, downsample_padding=0):
        super().__init__()
        boc = list(block_out_channels)
        ted = boc[0] * 4
        self.flip_sin_to_cos, self.freq_shift, self.ch0 = flip_sin_to_cos, freq_shift, boc[0]
        self.conv_in = nn.Conv2d(in_channels, boc[0], 3, padding=(1, 1))
        self.time_embedding = TimestepEmbedding(boc[0], ted)
        # Same registration dance as diffusers: mid_block is first set to None (a plain
        # attribute), so it lands in _modules -- and the state_dict -- AFTER up_blocks.
        self.down_blocks = nn.ModuleList([])
        self.mid_block = None
        self.up_blocks = nn.ModuleList([])

        out_ch = boc[0]
        for i, kind in enumerate(down_block_types):
            in_ch, out_ch = out_ch, boc[i]
            assert kind in ("DownBlock2D", "AttnDownBlock2D")
            self.down_blocks.append(DownBlock(
                in_ch, out_ch, ted, layers_per_block, kind == "AttnDownBlock2D",
                attention_head_dim if attention_head_dim is not None else out_ch,
                norm_num_groups, norm_eps, dropout, i != len(boc) - 1, downsample_padding))

        self.mid_block = UNetMidBlock2D(
            boc[-1], ted, attention_head_dim if attention_head_dim is not None else boc[-1],
            norm_num_groups, norm_eps, dropout)

        rev = list(reversed(boc))
        out_ch = rev[0]
        for i, kind in enumerate(up_block_types):
            prev, out_ch = out_ch, rev[i]
            in_ch = rev[min(i + 1, len(boc) - 1)]
            assert kind in ("UpBlock2D", "AttnUpBlock2D")
            self.up_blocks.append(UpBlock(
                in_ch, prev, out_ch, ted, layers_per_block + 1, kind == "AttnUpBlock2D",
                attention_head_dim if attention_head_dim is not None else out_ch,
                norm_num_groups, norm_eps, dropout, i != len(boc) - 1))

        self.conv_norm_out = nn.GroupNorm(norm_num_groups, boc[0], eps=norm_eps)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(boc[0], out_channels, 3, padding=1)

    def forward(self, sample, timesteps):
        t_emb = ddpm_timestep_embedding(timesteps, self.ch0, self.flip_sin_to_cos, self.freq_shift)
        emb = self.time_embedding(t_emb)
        sample = self.conv_in(sample)
        res = (sample,)
        for blk in self.down_blocks:
            sample, r = blk(sample, emb)
            res += r
        sample = self.mid_block(sample, emb)
        for blk in self.up_blocks:
            n = len(blk.resnets)
            r, res = res[-n:], res[:-n]
            sample = blk(sample, r, emb)
        return self.conv_out(self.conv_act(self.conv_norm_out(sample)))


def ddpm_block_types(n_levels, attn_res, image_size):
    down, up = [], []
    for i in range(n_levels):
        res = image_size >> i
        down.append("AttnDownBlock2D" if res in attn_res else "DownBlock2D")
    for i in range(n_levels):
        res = image_size >> (n_levels - 1 - i)
        up.append("AttnUpBlock2D" if res in attn_res else "UpBlock2D")
    return down, up


def build_ddpm(cfg):
    down, up = ddpm_block_types(len(cfg["block_out_channels"]), cfg["attention_resolutions"], cfg["image_size"])
    return UNet2DModel(cfg["in_channels"], cfg["out_channels"], cfg["block_out_channels"],
                       cfg["layers_per_block"], down, up, cfg["norm_num_groups"], cfg["norm_eps"],
                       cfg["attention_head_dim"], cfg["dropout"], cfg["flip_sin_to_cos"], cfg["freq_shift"])


# ---------------------------------------------------------------------------------------------
# Preset "seed": dome272 Diffusion-Models-pytorch modules.py UNet (first published version),
# widths scaled by `base` (orig 64) and time dim by `time_dim` (orig 256).

class SelfAttention(nn.Module):
    def __init__(self, channels, size, heads):
        super().__init__()
        self.channels, self.size = channels, size
        self.mha = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.ln = nn.LayerNorm([channels])
        self.ff_self = nn.Sequential(nn.LayerNorm([channels]), nn.Linear(channels, channels),
                                     nn.GELU(), nn.Linear(channels, channels))

    def forward(self, x):
        x = x.view(-1, self.channels, self.size * self.size).swapaxes(1, 2)
        x_ln = self.ln(x)
        a, _ = self.mha(x_ln, x_ln, x_ln)
        a = a + x
        a = self.ff_self(a) + a
        return a.swapaxes(2, 1).view(-1, self.channels, self.size, self.size)


class DoubleConv(nn.Module):
    def __init__(self, in_ch, out_ch, mid_ch=None, residual=False):
        super().__init__()
        self.residual = residual
        if not mid_ch:
            mid_ch = out_ch
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_ch, mid_ch, kernel_size=3, padding=1, bias=False),
            nn.GroupNorm(1, mid_ch), nn.GELU(),
            nn.Conv2d(mid_ch, out_ch, kernel_size=3, padding=1, bias=False),
            nn.GroupNorm(1, out_ch))

    def forward(self, x):
        if self.residual:
            return F.gelu(x + self.double_conv(x))
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_ch, out_ch, emb_dim):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_ch, in_ch, residual=True),
                                          DoubleConv(in_ch, out_ch))
        self.emb_layer = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, out_ch))

    def forward(self, x, t):
        x = self.maxpool_conv(x)
        emb = self.emb_layer(t)[:, :, None, None].repeat(1, 1, x.shape[-2], x.shape[-1])
        return x + emb


class Up(nn.Module):
    def __init__(self, in_ch, out_ch, emb_dim):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = nn.Sequential(DoubleConv(in_ch, in_ch, residual=True),
                                  DoubleConv(in_ch, out_ch, in_ch // 2))
        self.emb_layer = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, out_ch))

    def forward(self, x, skip_x, t):
        x = self.up(x)
        x = torch.cat([skip_x, x], dim=1)  # skip first here (unlike diffusers)
        x = self.conv(x)
        emb = self.emb_layer(t)[:, :, None, None].repeat(1, 1, x.shape[-2], x.shape[-1])
        return x + emb


class SeedUNet(nn.Module):
    def __init__(self, c_in, c_out, time_dim, base, image_size, heads=4):
        super().__init__()
        b, S, td = base, image_size, time_dim
        self.time_dim = td
        self.inc = DoubleConv(c_in, b)
        self.down1 = Down(b, 2 * b, td)
        self.sa1 = SelfAttention(2 * b, S // 2, heads)
        self.down2 = Down(2 * b, 4 * b, td)
        self.sa2 = SelfAttention(4 * b, S // 4, heads)
        self.down3 = Down(4 * b, 4 * b, td)
        self.sa3 = SelfAttention(4 * b, S // 8, heads)
        self.bot1 = DoubleConv(4 * b, 8 * b)
        self.bot2 = DoubleConv(8 * b, 8 * b)
        self.bot3 = DoubleConv(8 * b, 4 * b)
        self.up1 = Up(8 * b, 2 * b, td)
        self.sa4 = SelfAttention(2 * b, S // 4, heads)
        self.up2 = Up(4 * b, b, td)
        self.sa5 = SelfAttention(b, S // 2, heads)
        self.up3 = Up(2 * b, b, td)
        self.sa6 = SelfAttention(b, S, heads)
        self.outc = nn.Conv2d(b, c_out, kernel_size=1)

    def pos_encoding(self, t, channels):
        # table in float64, rounded once to float32 (see ddpm_timestep_embedding)
        inv_freq = (1.0 / (10000 ** (torch.arange(0, channels, 2, dtype=torch.float64, device=t.device)
                                     / channels))).to(torch.float32)
        a = torch.sin(t.repeat(1, channels // 2) * inv_freq)
        c = torch.cos(t.repeat(1, channels // 2) * inv_freq)
        return torch.cat([a, c], dim=-1)

    def forward(self, x, t):
        t = t.unsqueeze(-1).type(torch.float)
        t = self.pos_encoding(t, self.time_dim)
        x1 = self.inc(x)
        x2 = self.sa1(self.down1(x1, t))
        x3 = self.sa2(self.down2(x2, t))
        x4 = self.sa3(self.down3(x3, t))
        x4 = self.bot3(self.bot2(self.bot1(x4)))
        x = self.sa4(self.up1(x4, x3, t))
        x = self.sa5(self.up2(x, x2, t))
        x = self.sa6(self.up3(x, x1, t))
        return self.outc(x)


def build_seed(cfg):
    return SeedUNet(cfg["in_channels"], cfg["out_channels"], cfg["time_dim"], cfg["base"],
                    cfg["image_size"], cfg["heads"])


# ---------------------------------------------------------------------------------------------
# Configs

DDPM_CIFAR10 = {  # google/ddpm-cifar10-32
    "preset": "ddpm", "in_channels": 3, "out_channels": 3, "image_size": 32,
    "block_out_channels": [128, 256, 256, 256], "layers_per_block": 2, "attention_resolutions": [16],
    "norm_num_groups": 32, "norm_eps": 1e-6, "attention_head_dim": None, "dropout": 0.0,
    "flip_sin_to_cos": False, "freq_shift": 1,
}
DDPM_FIXTURE = {
    "preset": "ddpm", "in_channels": 3, "out_channels": 3, "image_size": 16,
    "block_out_channels": [16, 32, 32], "layers_per_block": 1, "attention_resolutions": [8],
    "norm_num_groups": 8, "norm_eps": 1e-6, "attention_head_dim": 16, "dropout": 0.0,
    "flip_sin_to_cos": False, "freq_shift": 1,
}
SEED_FULL = {"preset": "seed", "in_channels": 3, "out_channels": 3, "image_size": 64,
             "base": 64, "time_dim": 256, "heads": 4}
SEED_FIXTURE = {"preset": "seed", "in_channels": 3, "out_channels": 3, "image_size": 16,
                "base": 8, "time_dim": 32, "heads": 4}


def n_params(m):
    return sum(p.numel() for p in m.parameters())


# ---------------------------------------------------------------------------------------------
# safetensors writer (the safetensors package is not installed)

def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, off = [], 0
    for name, t in tensors:
        a = np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4", copy=False))
        assert a.dtype == np.dtype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__")
    data = raw[8 + n:]
    out, end = {}, 0
    for name, d in header.items():
        s, e = d["data_offsets"]
        assert s == end, "tensors must be contiguous in file order"
        end = e
        out[name] = np.frombuffer(data[s:e], dtype="<f4").reshape(d["shape"])
    assert end == len(data)
    return meta, out


# ---------------------------------------------------------------------------------------------
# Training

def ddpm_schedule(T, beta_start, beta_end):
    betas = torch.linspace(beta_start, beta_end, T, dtype=torch.float64)
    ac = torch.cumprod(1.0 - betas, dim=0)
    return torch.sqrt(ac).to(torch.float32), torch.sqrt(1.0 - ac).to(torch.float32)


def lr_at(s, lr, warmup, total):
    if s < warmup:
        return lr * (s + 1) / warmup
    return lr * 0.5 * (1.0 + math.cos(math.pi * (s - warmup) / (total - warmup)))


def float32_exact_round(x, bits=3):
    # x rounded to `bits` significant binary digits: exactly representable in float32 and JSON
    e = math.floor(math.log2(x))
    q = 2.0 ** (e - bits + 1)
    return round(x / q) * q


def make_data(cfg):
    g = torch.Generator().manual_seed(DATA_SEED)
    C, S, T = cfg["in_channels"], cfg["image_size"], TRAIN["T"]
    x0 = torch.rand(STEPS, BATCH, C, S, S, generator=g, dtype=torch.float32) * 2 - 1
    t = torch.randint(0, T, (STEPS, BATCH), generator=g)
    noise = torch.randn(STEPS, BATCH, C, S, S, generator=g, dtype=torch.float32)
    return x0, t, noise


def train(cfg, model):
    tr = dict(TRAIN)
    sqrt_ab, sqrt_1mab = ddpm_schedule(tr["T"], tr["beta_start"], tr["beta_end"])
    x0, t, noise = make_data(cfg)
    names = [n for n, _ in model.named_parameters()]
    sd_names = list(model.state_dict().keys())
    assert names == sd_names, "state_dict must hold parameters only, in parameters() order"
    params = [p for _, p in model.named_parameters()]
    init = [p.detach().clone() for p in params]
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                            weight_decay=tr["weight_decay"], foreach=False)
    losses, norms, lrs = [], [], []
    grad0 = xt0 = out0 = None
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        ts = t[s]
        xt = sqrt_ab[ts][:, None, None, None] * x0[s] + sqrt_1mab[ts][:, None, None, None] * noise[s]
        out = model(xt, ts.to(torch.float32))
        loss = F.mse_loss(out, noise[s])
        loss.backward()
        if s == 0:
            grad0 = [p.grad.detach().clone() for p in params]
            xt0, out0 = xt.detach().clone(), out.detach().clone()
            pre = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grad0]), 2.0).item()
            tr["clip"] = float32_exact_round(0.5 * pre)
        total_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=tr["clip"])
        lr_s = lr_at(s, tr["lr"], tr["warmup"], tr["steps"])
        for grp in opt.param_groups:
            grp["lr"] = lr_s
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, params):
                e.lerp_(p, 1.0 - tr["ema_decay"])
        losses.append(loss.item())
        norms.append(total_norm.item())
        lrs.append(lr_s)
        print(f"  step {s}: loss {loss.item():.7f}  grad_norm {total_norm.item():.6f}  "
              f"lr {lr_s:.6e}  {'clipped' if total_norm.item() > tr['clip'] else 'not clipped'}")
    assert norms[0] > tr["clip"], "clipping must be active at step 0"
    rel = abs(losses[-1] - losses[0]) / losses[0]
    print(f"  clip {tr['clip']}  loss moved {100 * rel:.1f}%")
    assert rel >= 0.05, f"loss moved only {100 * rel:.2f}%"

    tensors = []
    for n, p in zip(names, init):
        tensors.append(("param." + n, p))
    for n, g in zip(names, grad0):
        tensors.append(("grad." + n, g))
    for n, p in zip(names, params):
        tensors.append(("final." + n, p.detach()))
    for n, e in zip(names, ema):
        tensors.append(("ema." + n, e))
    tensors += [
        ("x0", x0), ("t", t.to(torch.float32)), ("noise", noise), ("xt0", xt0), ("out0", out0),
        ("loss", torch.tensor(losses, dtype=torch.float32)),
        ("grad_norm", torch.tensor(norms, dtype=torch.float32)),
        ("lr", torch.tensor(lrs, dtype=torch.float64).to(torch.float32)),
        ("sqrt_ab", sqrt_ab), ("sqrt_1mab", sqrt_1mab),
    ]
    meta = {"config": json.dumps(cfg), "train": json.dumps(tr), "torch": torch.__version__}
    return tensors, meta, losses


def print_keys(title, model, limit=None):
    sd = model.state_dict()
    keys = list(sd.keys())
    print(f"{title}: {len(keys)} tensors, {n_params(model):,} parameters")
    if limit is None:
        for k in keys:
            print(f"  {k} {tuple(sd[k].shape)}")
    else:
        for k in keys[:limit]:
            print(f"  {k} {tuple(sd[k].shape)}")
        print("  ...")
        for k in keys[-limit:]:
            print(f"  {k} {tuple(sd[k].shape)}")


def main():
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT_DIR, exist_ok=True)

    # Sanity: the full-size presets.
    torch.manual_seed(0)
    full = build_ddpm(DDPM_CIFAR10)
    print_keys("ddpm full (google/ddpm-cifar10-32)", full, limit=6)
    assert n_params(full) == 35_746_307, n_params(full)
    del full
    torch.manual_seed(0)
    full = build_seed(SEED_FULL)
    print_keys("seed full (base 64, time_dim 256)", full, limit=6)
    print(f"seed full parameter count: {n_params(full)}")
    del full

    for cfg, build in ((DDPM_FIXTURE, build_ddpm), (SEED_FIXTURE, build_seed)):
        name = cfg["preset"]
        torch.manual_seed(SEED)
        model = build(cfg).train()
        print_keys(f"{name} fixture model", model)
        tensors, meta, _ = train(cfg, model)
        path = os.path.join(OUT_DIR, name + ".safetensors")
        write_safetensors(path, tensors, meta)
        rmeta, rt = read_safetensors(path)
        assert rmeta == meta and list(rt.keys()) == [n for n, _ in tensors]
        for n, v in tensors:
            assert np.array_equal(rt[n], v.detach().numpy().astype(np.float32)), n
        print(f"  wrote {os.path.relpath(path, HERE)}: {os.path.getsize(path):,} bytes, "
              f"{len(tensors)} tensors")


if __name__ == "__main__":
    sys.exit(main())
