"""test_devices.py - a pool of two devices, cpu and an emulated cuda:0 (the CUDA backend built
against tests/gpu/emu, loaded through DDPMD_CUDA_MODULE; EMU_DEVICE_MB its memory), over real
sockets, budgets from DDPMD_VRAM_BUDGET as a list: each device holds one small job at a time.
A job nothing fits (memory.vram_budget below any plan) gets 422 with both devices' plans. A job
that fits only cuda:0 (a 16 px one: its decoded data counts on the cpu) runs there; a job goes
to the device its plan predicts fastest (the cpu: the emulator is slow), the next one to cuda:0
once the cpu is full, their children started with --device cpu / cuda:0 (2 host threads there),
and a cuda-only job stays queued when only the cpu frees. A sticky fault (EMU_FAULT_AT_LAUNCH:
a process's Nth kernel launch, past the probe's and the short job's) then hits the long cuda:0
job: it fails with the error, cuda:0 is poisoned and admits nothing (the queued cuda-only job
stays queued, a new one is refused with 503 and not stored), /readyz answers 503 naming it,
/devices and /metrics show it, and cpu jobs go on. Each device's reservations never pass its
budget. Bodies against openapi.yaml. Usage: test_devices.py PATH/TO/ddpmd
"""
import os
import sys
import threading
import time

from serverlib import Server, check, job_processes, need_fmnist, problem_ok, validate

# kernel launches under the emulator: the probe (ddpmd serve --probe --device cuda:0) 1629, the
# short 16 px job (2 steps and its 10-step grid) about 1530, a training step of the 8 px model
# about 230: a fault at this launch spares both and hits a long job within ~10 steps
FAULT_AT = 2500
# one 8 px job fits each device, two do not; a 16 px job (60000 images held as 784 bytes) fits
# cuda:0 only (checked below against the jobs' own plans)
BUDGETS = {"cpu": 64 << 20, "cuda:0": 48 << 20}


def spec(steps, size=8, **memory):
    """a model small enough for the emulator (10 timesteps: a 10-step grid), its plan forced to
    the plain one (the same bytes whatever budget it is fitted into)"""
    return {"model": {"preset": "ddpm", "in_channels": 1, "image_size": size,
                      "block_out_channels": [8, 16], "layers_per_block": 1,
                      "attention_resolutions": [], "norm_num_groups": 4},
            "data": {"dataset": "fashion-mnist", "fmnist_resize": "resize"},
            "diffusion": {"timesteps": 10},
            "train": {"batch": 2, "steps": steps, "threads": 1, "warmup": 1},
            "output": {"checkpoint_every": 0, "sample_every": 0, "log_every": 1,
                       "keep_last": 1, "samples": 1},
            "memory": dict({"precision": "f32", "micro_batch": 2, "recompute": "none",
                            "offload": "off"}, **memory)}


def plan_on(job, device):
    return [p for p in job["plans"] if p["device"] == device][0]


def devices_of_children(s, jobs):
    """{job: the --device of its `ddpmd train` process}"""
    out = {}
    for pid in job_processes(s.data):
        try:
            argv = open("/proc/%d/cmdline" % pid, "rb").read().decode().split("\0")
        except OSError:
            continue
        job = [j for j in jobs if any(j in v for v in argv)]
        if job and "--device" in argv:
            out[job[0]] = argv[argv.index("--device") + 1]
    return out


class Watch:
    """polls /devices: every time a device's reservations pass its budget"""

    def __init__(self, s):
        self.s, self.over, self.stop = s, [], threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                devs = self.s.get_json("/devices")["devices"]
            except OSError:  # the server is gone: the test failed elsewhere
                return
            for d in devs:
                if d["reserved_bytes"] > d["budget_bytes"]:
                    self.over.append(d)
            time.sleep(0.05)

    def done(self):
        self.stop.set()
        self.t.join()
        check(not self.over, "reservations over a budget: %s" % self.over[:3])


def main(exe):
    need_fmnist()
    emu = os.path.join(os.path.dirname(os.path.abspath(exe)), "libddpmd_cuda_emu.so")
    if not os.path.exists(emu):
        print("SKIP: no %s (the CUDA emulator module is built beside ddpmd)" % emu)
        sys.exit(77)
    # four job slots at the warm-up (the default is one): the process overhead the budgets below
    # were sized with
    env = {"DDPMD_CUDA_MODULE": emu, "EMU_DEVICE_MB": "512", "EMU_FAULT_AT_LAUNCH": str(FAULT_AT),
           "DDPMD_CUDA_SLOTS": "4",
           "DDPMD_VRAM_BUDGET": ",".join("%s=%d" % kv for kv in BUDGETS.items())}
    s = Server(exe, args=["--device", "cpu", "--device", "cuda:0"], env=env).start()
    devs = s.get_json("/devices")
    validate(devs, "DeviceList")
    check([d["name"] for d in devs["devices"]] == ["cpu", "cuda:0"] and
          [d["budget_bytes"] for d in devs["devices"]] == list(BUDGETS.values()) and
          devs["devices"][1]["kind"] == "cuda" and devs["devices"][1]["overhead_bytes"] > 0,
          "devices %s" % devs)
    watch = Watch(s)

    # nothing fits: 422 with each device's smallest plan
    p = problem_ok(s.request("POST", "/train", spec(10, vram_budget="64KiB")), 422)
    check(p["type"].endswith("never-fits") and [q["device"] for q in p["plans"]] ==
          ["cpu", "cuda:0"] and not any(q["fits"] for q in p["plans"]) and
          p["plan"]["device"] == p["device"] and p["needed_bytes"] == p["plan"]["reserved_bytes"],
          "422 %s" % p)
    check(s.get_json("/jobs")["jobs"] == [], "a refused job left a row")

    # a job that fits cuda:0 only runs there
    wide = s.request("POST", "/train", spec(2, size=16)).json()
    validate(wide, "Job")
    # queued (device null) or, when the scheduler was quicker than the answer, already on cuda:0
    check(wide["device"] in (None, "cuda:0") and not plan_on(wide, "cpu")["fits"] and
          plan_on(wide, "cuda:0")["fits"] and wide["plan"]["device"] == "cuda:0",
          "wide: device %s, plan on %s, plans %s" % (wide["device"], wide["plan"]["device"],
                                                      wide["plans"]))
    wj = s.wait_job(wide["id"], lambda j: j["state"] == "succeeded", what="the wide job done",
                    timeout=180)
    check(wj["device"] == "cuda:0" and wj["threads"] == 2 and wj["plan"]["device"] == "cuda:0" and
          wj["plan"]["reserved_bytes"] == plan_on(wj, "cuda:0")["reserved_bytes"]
          and wj["reserved_bytes"] == wj["plan"]["reserved_bytes"], "wide %s" % wj)
    r = {d: plan_on(wide, d)["reserved_bytes"] for d in BUDGETS}

    # the fastest device first (the cpu), then cuda:0 once the cpu is full
    a = s.request("POST", "/train", spec(100000)).json()
    check(all(q["fits"] for q in a["plans"]), "a's plans %s" % a["plans"])
    ra = {d: plan_on(a, d)["reserved_bytes"] for d in BUDGETS}
    check(ra["cpu"] <= BUDGETS["cpu"] < 2 * ra["cpu"] and r["cpu"] > BUDGETS["cpu"] and
          ra["cuda:0"] <= BUDGETS["cuda:0"] < 2 * ra["cuda:0"],
          "sizes: 8 px %s, 16 px %s do not make the case for %s" % (ra, r, BUDGETS))
    a = s.wait_job(a["id"], lambda j: j["state"] == "running", what="a running")
    check(a["device"] == "cpu" and a["reserved_bytes"] == ra["cpu"], "a on %s" % a["device"])
    b = s.request("POST", "/train", spec(100000)).json()["id"]
    b = s.wait_job(b, lambda j: j["state"] == "running", what="b running")
    validate(b, "Job")
    check(b["device"] == "cuda:0" and b["threads"] == 2 and b["reserved_bytes"] == ra["cuda:0"],
          "b: %s, %s threads, %s bytes" % (b["device"], b["threads"], b["reserved_bytes"]))
    # their processes: `ddpmd train ... --device D`
    kids = devices_of_children(s, (a["id"], b["id"]))
    check(kids == {a["id"]: "cpu", b["id"]: "cuda:0"}, "the children's devices: %s" % kids)
    # a cuda-only job waits; the cpu frees and it does not take it
    wide2 = s.request("POST", "/train", spec(2, size=16)).json()["id"]
    check(s.request("POST", "/jobs/%s/cancel" % a["id"]).status == 202, "cancel a")
    s.wait_job(a["id"], lambda j: j["state"] == "canceled", what="a canceled")

    # b meets the sticky fault: it fails, cuda:0 is poisoned
    bj = s.wait_job(b["id"], lambda j: j["state"] == "failed", what="b failed", timeout=180)
    check("cudaErrorIllegalAddress" in bj["error"] and "cuda:0 is poisoned" in bj["error"],
          "error %s" % bj["error"])
    ready = s.request("GET", "/readyz")
    check(ready.status == 503, "readyz %d with a poisoned device" % ready.status)
    rj = ready.json()
    validate(rj, "Ready")
    check(rj["poisoned"] == ["cuda:0"] and rj["devices"][1]["poisoned"] and
          not rj["devices"][0]["poisoned"], "readyz %s" % rj)
    time.sleep(1.5)  # a scheduling pass or more
    d = s.get_json("/devices")["devices"]
    check(d[1]["poisoned"] and b["id"] in d[1]["poisoned_by"] and "poisoned" in d[1]["poisoned_by"]
          and d[1]["running_jobs"] == 0 and d[1]["reserved_bytes"] == 0 and
          d[1]["waiting_jobs"] == 1 and d[0]["running_jobs"] == 0 and d[0]["waiting_jobs"] == 0,
          "devices %s" % d)
    check(s.get_json("/jobs/" + wide2)["state"] == "queued", "the cuda-only job left the queue")
    m = s.request("GET", "/metrics").body.decode()
    check('ddpmd_device_poisoned{device="cuda:0"} 1' in m and
          'ddpmd_device_poisoned{device="cpu"} 0' in m, "metrics: %s" %
          [x for x in m.splitlines() if "poisoned" in x])
    # nothing more for cuda:0: a job fitting only it is refused, stored nowhere
    n_jobs = len(s.get_json("/jobs")["jobs"])
    p = problem_ok(s.request("POST", "/train", spec(2, size=16)), 503)
    check(p["type"].endswith("device-poisoned") and p["device"] == "cuda:0", "503 %s" % p)
    check(len(s.get_json("/jobs")["jobs"]) == n_jobs, "a refused job was stored")
    # the cpu goes on
    c = s.request("POST", "/train", spec(3)).json()["id"]
    cj = s.wait_job(c, lambda j: j["state"] == "succeeded", what="a cpu job after the poisoning")
    check(cj["device"] == "cpu", "c ran on %s" % cj["device"])
    watch.done()
    check(s.stop() == 0, "exit status")
    print("test_devices: ok (8 px %s, 16 px %s)" % (ra, r))


if __name__ == "__main__":
    main(sys.argv[1])
