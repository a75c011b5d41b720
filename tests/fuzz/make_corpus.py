#!/usr/bin/env python3
"""make_corpus.py - writes the committed seed corpus tests/fuzz/corpus/<target>/ (deterministic:
running it again gives the same bytes). Valid examples of every format plus a few edge cases;
libFuzzer mutates from these. Usage: python3 tests/fuzz/make_corpus.py (from anywhere)."""
import gzip
import io
import json
import os
import struct
import tarfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- spec ----
def specs():
    for fn in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if fn.endswith(".json"):
            with open(os.path.join(ROOT, "examples", fn), "rb") as f:
                put("spec", "example-" + fn[:-5], f.read())
    small = ('{"model":{"preset":"ddpm","in_channels":1,"image_size":32},'
             '"data":{"dataset":"fashion-mnist"},"train":{"batch":1,"steps":1}}')
    put("spec", "minimal", small)
    put("spec", "seed-preset", '{"model":{"preset":"seed","in_channels":3,"image_size":64},'
        '"data":{"dataset":"imgs/"},"train":{"batch":2,"steps":3,"seed":18446744073709551615}}')
    put("spec", "empty-object", "{}")
    put("spec", "empty", "")
    put("spec", "array", "[1,2,3]")
    put("spec", "duplicate-key", small[:-1] + ',"train":{"batch":0}}')
    put("spec", "trailing-garbage", small + "x")
    put("spec", "nul-escape", small.replace('fashion-mnist', 'fashion\\u0000mnist'))
    put("spec", "deep", "[" * 200 + "]" * 200)
    put("spec", "numbers", '{"train":{"lr":1e-50,"beta2":0.99999999,"seed":9007199254740993,'
        '"batch":1e300,"eps":-0.0}}')
    put("spec", "memory", small[:-1] + ',"memory":{"vram_budget":"1.5GiB","precision":"bf16",'
        '"micro_batch":3,"recompute":"resblock","offload":"on","loss_scale":{"initial":1024,'
        '"growth":2,"backoff":0.5,"growth_interval":100}}}')
    put("spec", "memory-bad", small[:-1] + ',"memory":{"vram_budget":"1e999GiB","precision":[],'
        '"micro_batch":-7,"loss_scale":{"initial":1e300,"x":null},"offload":true}}')
    put("spec", "types", '{"model":{"preset":7,"block_out_channels":"x","layers_per_block":[]},'
        '"data":null,"train":true}')


# ---- safetensors ----
def safetensors(tensors, meta=None, pad=8, hdr_override=None):
    """tensors: list of (name, dtype, shape, bytes)"""
    h = {}
    if meta is not None:
        h["__metadata__"] = meta
    off = 0
    data = b""
    for name, dt, shape, b in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        data += b
    hj = hdr_override if hdr_override is not None else json.dumps(h, separators=(",", ":"))
    hb = hj.encode()
    if pad:
        hb += b" " * (-len(hb) % pad)
    return struct.pack("<Q", len(hb)) + hb + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def sts():
    put("safetensors", "f32-2x3", safetensors([("w", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6))]))
    put("safetensors", "mixed", safetensors([
        ("a.weight", "F32", [2, 2], f32(0.5, -1, 2, 3)),
        ("a.bias", "F16", [2], b"\x00\x3c\x00\xc0"),
        ("b", "BF16", [1, 1, 1, 1], b"\x80\x3f"),
        ("step", "I64", [], struct.pack("<q", 7)),
        ("mask", "BOOL", [3], b"\x01\x00\x01"),
        ("empty", "F32", [0, 4], b""),
    ], meta={"format": "pt", "note": "x"}))
    put("safetensors", "empty-table", safetensors([], meta={}))
    put("safetensors", "no-header", struct.pack("<Q", 0))
    put("safetensors", "huge-length", struct.pack("<Q", 1 << 62) + b"{}")
    put("safetensors", "short", b"\x02\x00\x00")
    put("safetensors", "overlap", safetensors([], hdr_override=(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')) + f32(1))
    put("safetensors", "dup-name", safetensors([], hdr_override=(
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}')) + b"\x01\x02")
    put("safetensors", "big-shape", safetensors([], hdr_override=(
        '{"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}'))
        + b"\0" * 8)


def ckpt():
    with open(os.path.join(ROOT, "examples", "fmnist-tiny.json")) as f:
        spec = json.dumps(json.load(f), separators=(",", ":"))
    meta = {"format": "ddpmd-checkpoint", "format_version": "1", "step": "100",
            "rng_position": "100", "threads": "2", "spec": spec}
    t = [("conv_in.weight", "F32", [2, 1, 1, 1], f32(0.25, -0.25)),
         ("ema.conv_in.weight", "F32", [2, 1, 1, 1], f32(0.2, -0.2))]
    put("checkpoint", "valid", safetensors(t, meta=meta))
    put("checkpoint", "no-spec", safetensors(t, meta={"format": "ddpmd-checkpoint", "step": "1"}))
    put("checkpoint", "bad-step", safetensors(t, meta=dict(meta, step="-3")))
    put("checkpoint", "huge-step", safetensors(t, meta=dict(meta, step="99999999999999999999999")))
    put("checkpoint", "empty-step", safetensors(t, meta=dict(meta, step="")))
    put("checkpoint", "bad-spec", safetensors(t, meta=dict(meta, spec='{"model":{"layers_per_block":99}}')))
    put("checkpoint", "wrong-format", safetensors(t, meta=dict(meta, format="pt")))


# ---- PNG ----
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(w, h, depth, ctype, rows, extra=(), interlace=0):
    sig = b"\x89PNG\r\n\x1a\n"
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)
    raw = b"".join(b"\x00" + r for r in rows)
    out = sig + chunk(b"IHDR", ihdr)
    for k, d in extra:
        out += chunk(k, d)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def pngs():
    put("png", "grey8-1x1", png(1, 1, 8, 0, [b"\x80"]))
    put("png", "rgb8-3x2", png(3, 2, 8, 2, [bytes(range(9)), bytes(range(100, 109))]))
    put("png", "rgba8-2x2", png(2, 2, 8, 6, [b"\xff\x00\x00\x80\x00\xff\x00\xff", b"\0" * 8]))
    put("png", "grey16a-2x1", png(2, 1, 16, 4, [b"\x12\x34\xff\xff\xab\xcd\x00\x00"]))
    put("png", "grey2-4x2", png(4, 2, 2, 0, [b"\x1b", b"\xe4"]))
    put("png", "palette-trns-2x2", png(2, 2, 8, 3, [b"\x00\x01", b"\x01\x00"],
                                       extra=[(b"PLTE", b"\xff\x00\x00\x00\x00\xff"),
                                              (b"tRNS", b"\x80")]))
    put("png", "grey-trns-2x1", png(2, 1, 8, 0, [b"\x05\x06"], extra=[(b"tRNS", b"\x00\x05")]))
    # Adam7 with a 1x1 image is a single pass: a valid interlaced file
    put("png", "interlaced-1x1", png(1, 1, 8, 2, [b"\x10\x20\x30"], interlace=1))
    valid = png(3, 2, 8, 2, [bytes(range(9)), bytes(range(100, 109))])
    put("png", "truncated", valid[:-20])
    put("png", "signature-only", valid[:8])
    # a chunk declaring 2 GiB (the 44-byte file shape)
    put("png", "huge-chunk", valid[:33] + struct.pack(">I", 0x7FFFFFF0) + b"tEXt" + b"a\0b")
    put("png", "too-wide", png(1 << 20, 1, 8, 0, [b""]))


# ---- IDX (options byte, u32 LE image-file length, image file, label file) ----
def idx_input(opts, images, labels, gz=False):
    n = len(labels)
    img = struct.pack(">IIII", 2051, n, 28, 28) + images
    lab = struct.pack(">II", 2049, n) + bytes(labels)
    if gz:
        img = gzip.compress(img, mtime=0)
        lab = gzip.compress(lab, mtime=0)
    return bytes([opts]) + struct.pack("<I", len(img)) + img + lab


def idxs():
    pix = bytes((i * 7) & 255 for i in range(2 * 784))
    put("idx", "two-pad", idx_input(0, pix, [3, 9]))
    put("idx", "two-resize-rgb", idx_input(1, pix, [0, 1]))
    put("idx", "two-gz-test", idx_input(2, pix, [4, 5], gz=True))
    put("idx", "bad-label", idx_input(0, pix, [3, 10]))
    put("idx", "extra-byte", idx_input(0, pix + b"\0", [1, 2]))
    put("idx", "truncated", idx_input(0, pix[:-1], [1, 2]))
    put("idx", "count-mismatch", bytes([0]) + struct.pack("<I", 16 + 784) +
        struct.pack(">IIII", 2051, 1, 28, 28) + pix[:784] + struct.pack(">II", 2049, 2) + b"\1\2")


# ---- http (byte 0 mod 4: 0 checkpoint id, 1 job id, 2 state, 3 token file) ----
def https():
    put("http", "ckpt-id", b"\x00j0123456789abcdef-300")
    put("http", "ckpt-id-zero", b"\x00j0123456789abcdef-0")
    put("http", "ckpt-id-lead0", b"\x00j0123456789abcdef-0300")
    put("http", "ckpt-id-huge", b"\x00j0123456789abcdef-9999999999999")
    put("http", "job-id", b"\x01j00000000deadbeef")
    put("http", "job-id-upper", b"\x01j0123456789ABCDEF")
    put("http", "state", b"\x02running")
    put("http", "state-bad", b"\x02Running")
    put("http", "tokens", b"\x03# tokens\nalice 0123456789abcdef0123 admin\n\nbob "
        b"bbbbbbbbbbbbbbbbbbbb # comment\n")
    put("http", "tokens-short", b"\x03carol short\n")
    put("http", "tokens-extra", b"\x03dave dddddddddddddddddd admin more\n")
    put("http", "tokens-long-line", b"\x03" + b"e" * 2000 + b" " + b"s" * 300 + b"\n")
    put("http", "tokens-secret-256", b"\x03eve " + b"X" * 255 + b"admin\n")
    # byte 0 = 9: the Content-Type check and server/utf8.c (cut, clean, escape)
    put("http", "utf8-mixed", b"\x09/jobs/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xe2\x82"
        b"\n\x1b[31m\xc2\x85\\\xed\xa0\x80\xc0\xaf\xff x")


# ---- archive (POST /datasets) ----
def tar_bytes(entries, gz=False):
    """entries: (name, bytes) files or (name, tarfile type, linkname); deterministic (mtime 0)"""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
        for e in entries:
            ti = tarfile.TarInfo(e[0])
            ti.mtime = 0
            if len(e) == 2:
                ti.size = len(e[1])
                t.addfile(ti, io.BytesIO(e[1]))
            else:
                ti.type, ti.linkname = e[1], e[2]
                t.addfile(ti)
    raw = b.getvalue()
    return gzip.compress(raw, 6, mtime=0) if gz else raw


def archives():
    a = png(2, 2, 8, 0, [b"\x10\x20", b"\x30\x40"])
    b = png(3, 2, 8, 2, [bytes(range(9)), bytes(range(100, 109))])
    put("archive", "two-pngs", tar_bytes([("a.png", a), ("b.png", b)]))
    put("archive", "two-pngs-gz", tar_bytes([("a.png", a), ("b.png", b)], gz=True))
    put("archive", "class-folders", tar_bytes([("cat", tarfile.DIRTYPE, ""), ("cat/a.png", a),
                                              ("dog/b.png", b)]))
    put("archive", "traversal", tar_bytes([("../a.png", a)]))
    put("archive", "absolute", tar_bytes([("/a.png", a)]))
    put("archive", "symlink", tar_bytes([("a.png", a), ("l.png", tarfile.SYMTYPE, "a.png")]))
    put("archive", "hardlink", tar_bytes([("a.png", a), ("h.png", tarfile.LNKTYPE, "a.png")]))
    put("archive", "device", tar_bytes([("d.png", tarfile.CHRTYPE, "")]))
    put("archive", "not-png", tar_bytes([("a.png", b"hello")]))
    put("archive", "truncated", tar_bytes([("a.png", a), ("b.png", b)])[:700])
    put("archive", "duplicate", tar_bytes([("a.png", a), ("a.png", a)]))


if __name__ == "__main__":
    specs()
    sts()
    ckpt()
    pngs()
    idxs()
    https()
    archives()
