"""test_host_peak.py - a job's reservation on the cpu device is the whole truth in its process:
jobs of several kinds (Fashion-MNIST padded and resized to RGB at 40 px, a wider model on two
threads, an offloaded one, an uploaded folder held as its bytes and resized per batch, a second
job on it mapping the decoded copy the first left, a sampling job) run under a server whose children record their peak
resident bytes by phase (DDPMD_TEST_PEAK_DIR: testhold_phase), and each one's VmHWM - through
its weights read, data load, steps, checkpoints, grids and its end - stays within the
reserved_bytes the pool gave it (plan + its host part + host plan + the probe's process
baseline). Usage: test_host_peak.py PATH/TO/ddpmd
"""
import glob
import gzip
import io
import os
import struct
import sys
import tarfile
import tempfile
import time
import zlib

from serverlib import Server, check, need_fmnist, tiny


def peaks(d):
    """{job output path: [(phase, VmHWM bytes, VmRSS bytes)]} from the children's records"""
    out = {}
    for p in glob.glob(os.path.join(d, "peak-*.txt")):
        lines = open(p).read().split("\n")
        job = lines[0][4:]
        out[job] = [(l.split()[0], int(l.split()[1]) * 1024, int(l.split()[2]) * 1024)
                    for l in lines[1:] if l.strip()]
    return out


def folder_tar(n, w, h):
    """a tar.gz of n RGB w x h PNGs (8 bit), each a different gradient"""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as t:
        for i in range(n):
            raw = b"".join(b"\0" + bytes((x * 9 + y * 5 + i * 13 + k * 80) % 256
                                          for x in range(w) for k in range(3)) for y in range(h))
            data = (b"\x89PNG\r\n\x1a\n"
                    + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
            ti = tarfile.TarInfo("img%03d.png" % i)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return gzip.compress(b.getvalue())


def main(exe):
    need_fmnist()
    pd = tempfile.mkdtemp(prefix="ddpmd-peak-")
    s = Server(exe, env={"DDPMD_TEST_PEAK_DIR": pd}).start()
    small = tiny(steps=4, batch=4, checkpoint_every=2, sample_every=2, samples=4)
    small["diffusion"] = {"timesteps": 20}
    small["data"]["validation"] = 8
    rgb = tiny(steps=3, batch=4, checkpoint_every=0, samples=4)
    rgb["model"].update(in_channels=3, image_size=40, attention_resolutions=[10])
    rgb["data"].update(fmnist_resize="resize", flip=True)
    rgb["diffusion"] = {"timesteps": 20}
    wide = tiny(steps=2, batch=8, checkpoint_every=0, samples=4, threads=2)
    wide["model"]["block_out_channels"] = [96, 192, 192]
    wide["diffusion"] = {"timesteps": 10}
    off = tiny(steps=2, batch=4, checkpoint_every=0, samples=2)
    off["memory"] = {"offload": "on"}
    off["diffusion"] = {"timesteps": 10}
    # an uploaded folder of 400 RGB 48x40 PNGs, held as their bytes (2.3 MB) and resized to 64 px
    # per draw (as float: 19.7 MB, past what the rest of its reservation leaves)
    r = s.request("POST", "/datasets", body=folder_tar(400, 48, 40),
                  headers={"Content-Type": "application/gzip"}, timeout=60)
    check(r.status == 202, "POST /datasets: %d %s" % (r.status, r.body[:300]))
    did = r.json()["id"]
    for _ in range(600):
        if s.get_json("/datasets/" + did)["state"] != "validating":
            break
        time.sleep(0.1)
    d = s.get_json("/datasets/" + did)
    check(d["state"] == "ready" and d.get("source_bytes") == 400 * 48 * 40 * 3,
          "the folder: %s" % d)
    fold = tiny(steps=3, batch=4, checkpoint_every=0, samples=2)
    fold["model"].update(in_channels=3, image_size=64, attention_resolutions=[16])
    fold["data"] = {"dataset": did, "validation": 8, "flip": True}
    fold["diffusion"] = {"timesteps": 10}
    jobs = {}
    for name, spec in (("small", small), ("rgb", rgb), ("wide", wide), ("offload", off),
                       ("folder", fold)):
        r = s.request("POST", "/train", spec)
        check(r.status == 202, "POST /train %s: %d %s" % (name, r.status, r.body[:300]))
        jobs[name] = r.json()["id"]
    for name, jid in jobs.items():
        s.wait_job(jid, lambda j: j["state"] in ("succeeded", "failed"), timeout=600,
                   what="job %s ending" % name)
        j = s.get_json("/jobs/" + jid)
        check(j["state"] == "succeeded", "job %s: %s" % (name, j.get("error")))
    # a second job on the folder maps the decoded copy the first wrote: its mapped pages count
    # in its VmHWM, within the same reservation
    r = s.request("POST", "/train", fold)
    check(r.status == 202, "POST /train folder-mapped: %d %s" % (r.status, r.body[:300]))
    jobs["folder-mapped"] = r.json()["id"]
    s.wait_job(jobs["folder-mapped"], lambda j: j["state"] in ("succeeded", "failed"), timeout=600,
               what="job folder-mapped ending")
    mlog = s.request("GET", "/jobs/%s/logs" % jobs["folder-mapped"]).body.decode()
    check("400 images mapped from the dataset's decoded copy" in mlog,
          "the second folder job did not map the copy: %s" % mlog[:400])
    r = s.request("POST", "/samples", {"job": jobs["small"], "n": 16, "sampler": "ddim",
                                       "steps": 5, "seed": 3, "batch": 4, "ema": True})
    check(r.status == 202, "POST /samples: %d %s" % (r.status, r.body[:300]))
    jobs["sample"] = r.json()["id"]
    s.wait_job(jobs["sample"], lambda j: j["state"] in ("succeeded", "failed"), timeout=300,
               what="the sampling job ending")
    got = peaks(pd)
    for name, jid in jobs.items():
        j = s.get_json(("/samples/" if name == "sample" else "/jobs/") + jid)
        check(j["state"] == "succeeded", "job %s: %s" % (name, j.get("error")))
        rec = [v for k, v in got.items() if jid in k]
        check(len(rec) == 1, "job %s: %d peak records (%s)" % (name, len(rec), list(got)))
        phases = rec[0]
        reserved, plan = j["reserved_bytes"], j["plan"]
        hwm = max(p[1] for p in phases)
        seen = {}
        for ph, h, _ in phases:
            seen[ph] = max(seen.get(ph, 0), h)
        print("  %-8s reserved %7.1f MiB (plan %.1f + host part %.1f + host plan %.1f + baseline "
              "%.1f)  VmHWM %7.1f MiB  by phase: %s" % (
                  name, reserved / 2**20, plan["plan_bytes"] / 2**20, plan["host_bytes"] / 2**20,
                  plan["host_data_bytes"] / 2**20, plan["process_baseline_bytes"] / 2**20,
                  hwm / 2**20, ", ".join("%s %.1f" % (k, v / 2**20) for k, v in seen.items())),
              flush=True)
        check(phases[-1][0] == "end", "job %s: no end record %s" % (name, phases))
        check(hwm <= reserved, "job %s: peak resident %d bytes over its reservation %d (%s)" % (
            name, hwm, reserved, phases))
    check(s.stop() == 0, "exit status")
    for p in glob.glob(os.path.join(pd, "*")):
        os.unlink(p)
    os.rmdir(pd)
    print("test_host_peak: ok")


if __name__ == "__main__":
    main(sys.argv[1])
