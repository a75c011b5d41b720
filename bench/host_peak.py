"""host_peak.py - one training job's cpu reservation against its process's peak resident bytes:
starts `ddpmd serve` with a cpu budget, submits examples/fmnist-tiny.json with the given channels
and steps (issue 24's case: 96,192,192 at batch 32), polls the job's process every 20 ms (VmRSS,
VmHWM) and prints the reservation, its parts and the peak. Works with any ddpmd build (before
and after a change), so the two print comparable lines.

Usage: python3 bench/host_peak.py PATH/TO/ddpmd [--channels 96,192,192] [--steps 3]
       [--budget 1GiB]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from serverlib import Server, job_processes  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--channels", default="96,192,192")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", default="1GiB")
    a = ap.parse_args()
    spec = json.load(open(os.path.join(ROOT, "examples", "fmnist-tiny.json")))
    spec["model"]["block_out_channels"] = [int(c) for c in a.channels.split(",")]
    spec["train"]["steps"] = a.steps
    spec["output"].update(checkpoint_every=0, log_every=1)
    s = Server(a.exe, args=["--vram-budget", "cpu=" + a.budget]).start()
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
