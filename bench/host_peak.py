"""host_peak.py - one training job's cpu reservation against its process's peak resident bytes:
starts `ddpmd serve` with a cpu budget, submits examples/fmnist-tiny.json with the given channels
and steps (issue 24's case: 96,192,192 at batch 32), polls the job's process every 20 ms (VmRSS,
VmHWM) and prints the reservation, its parts and the peak. Works with any ddpmd build (before
and after a change), so the two print comparable lines. --folder N,C,SIDE trains instead on an
uploaded folder of N generated C-channel SIDE x SIDE PNGs (POST /datasets, then ready), at
SIDE px with C channels.

Usage: python3 bench/host_peak.py PATH/TO/ddpmd [--channels 96,192,192] [--steps 3]
       [--budget 1GiB] [--folder 20000,3,32]
"""
import gzip
import io
import argparse
import json
import os
import struct
import sys
import tarfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from serverlib import Server, job_processes  # noqa: E402


def png(w, c, i):
    """a w x w PNG of c channels (8 bit): a disc on a gradient, different for each i"""
    cx, cy, r = (i * 7) % w, (i * 11) % w, 2 + i % max(1, w // 3)
    rows = b""
    for y in range(w):
        row = bytearray(b"\0")
        for x in range(w):
            v = 230 if (x - cx) ** 2 + (y - cy) ** 2 < r * r else 20 + (x * 3 + y * 5 + i) % 40
            row += bytes((v + 37 * k * (i % 3)) % 256 for k in range(c))
        rows += row

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, w, 8,
                                                             {1: 0, 3: 2}[c], 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def upload_folder(s, n, c, w):
    """an uploaded folder of n generated PNGs, ready: its id"""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as t:
        for i in range(n):
            data = png(w, c, i)
            ti = tarfile.TarInfo("img%06d.png" % i)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    r = s.request("POST", "/datasets", body=gzip.compress(b.getvalue(), 6),
                  headers={"Content-Type": "application/gzip"}, timeout=600)
    if r.status not in (201, 202):
        sys.exit("POST /datasets: %d %s" % (r.status, r.body[:300]))
    did = r.json()["id"]
    while True:
        d = s.get_json("/datasets/" + did)
        if d["state"] != "validating":
            break
        time.sleep(0.2)
    if d["state"] != "ready":
        sys.exit("the dataset: %s" % d)
    return did


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--channels", default="96,192,192")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--folder", default="")
    a = ap.parse_args()
    spec = json.load(open(os.path.join(ROOT, "examples", "fmnist-tiny.json")))
    spec["model"]["block_out_channels"] = [int(c) for c in a.channels.split(",")]
    spec["train"]["steps"] = a.steps
    spec["output"].update(checkpoint_every=0, log_every=1)
    s = Server(a.exe, args=["--vram-budget", "cpu=" + a.budget]).start()
    if a.folder:
        n, c, w = (int(v) for v in a.folder.split(","))
        spec["data"]["dataset"] = upload_folder(s, n, c, w)
        spec["model"].update(in_channels=c, image_size=w)
    r = s.request("POST", "/train", spec)
    if r.status != 202:
        sys.exit("POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    j = s.get_json("/jobs/" + jid)
    p = j["plan"]
    print("reserved %.1f MiB = plan %.1f + host data %.1f + baseline %.1f" % (
        j["reserved_bytes"] / 2**20, p["plan_bytes"] / 2**20, p["host_data_bytes"] / 2**20,
        p["process_baseline_bytes"] / 2**20), flush=True)
    if "host_parts" in p:
        print("host parts (MiB): " + ", ".join("%s %.1f" % (k, v / 2**20)
                                              for k, v in p["host_parts"].items()))
    pid, t0, last, rss = None, time.time(), None, []
    while time.time() - t0 < 3600:
        if pid is None:
            ps = job_processes(s.data)
            pid = ps[0] if ps else None
        if pid:
            try:
                st = open("/proc/%d/status" % pid).read()
            except OSError:
                break
            kv = {l.split(":")[0]: int(l.split()[1]) for l in st.splitlines()
                  if l.startswith(("VmHWM", "VmRSS"))}
            if "VmHWM" in kv:
                last = kv
                rss.append(kv["VmRSS"])
        time.sleep(0.02)
    j = s.get_json("/jobs/" + jid)
    s.stop()
    if j["state"] != "succeeded" or not last:
        sys.exit("the job %s: %s" % (j["state"], j.get("error")))
    res = j["reserved_bytes"] / 2**20
    n = len(rss)
    print("VmRSS (MiB) at tenths of the run: " +
          ", ".join("%.0f" % (rss[int(k * (n - 1) / 9)] / 1024) for k in range(10)))
    print("VmHWM %.1f MiB vs reserved %.1f MiB: %+.1f%%" % (
        last["VmHWM"] / 1024, res, 100 * (last["VmHWM"] / 1024 / res - 1)))


if __name__ == "__main__":
    main()
