"""test_backfill.py - the queue is FIFO with backfill: while the head waits for bytes, a later job
that fits now starts ahead of it only if it cannot delay the head's start, by time (it ends,
by its steps x predicted step time, before the running jobs free the head's bytes) or by bytes
(it takes only what the head will not need then). On a cpu device with a budget made from the
jobs' own reservations (r: small training job, s: sampling job, h = head, r + s < h < 2r):
A (r, 100 steps) runs; then H (h), C1 (r, endless), S (s, a long sampling job), C2 (r, 3 steps)
are queued in that order. S starts by bytes, C2 by time, C1 never before H; H starts once A
ends, and nothing that started after it held the bytes it needed then. The sum of reservations
never passes the budget. A is held at its step 50 (the test-only knob DDPMD_TEST_HOLD_STEP/FILE,
server/testhold.h) until S and C2 have been seen backfilled, so how fast steps run (a fast
machine, or one under load) cannot end A before the queue behind it is decided. Usage: test_backfill.py PATH/TO/ddpmd
"""
import os
import sys
import tempfile
import threading
import time

from serverlib import Server, check, need_fmnist, problem_ok, tiny


def small(**kw):
    """a small job whose plan is the plain one (every memory strategy forced), so its
    reservation is the same whatever budget it is fitted into"""
    s = tiny(**kw)
    s["model"].update(block_out_channels=[16, 32], attention_resolutions=[])
    s["memory"] = {"precision": "f32", "micro_batch": s["train"]["batch"], "recompute": "none",
                   "offload": "off"}
    return s


def main(exe):
    need_fmnist()
    # the reservations, from the 422s of a server with no room
    s0 = Server(exe, args=["--vram-budget", "cpu=1MiB"]).start()

    def needed(**kw):
        return problem_ok(s0.request("POST", "/train", small(**kw)), 422)["needed_bytes"]
    r = needed()

    # a checkpoint to sample from, and the sampling job's reservation
    s1 = Server(exe).start()
    data = s1.data
    src = s1.request("POST", "/train", small(steps=2, checkpoint_every=0)).json()["id"]
    s1.wait_job(src, lambda j: j["state"] == "succeeded", what="the source checkpoint")
    sample = {"job": src, "n": 16, "batch": 16, "sampler": "ddpm"}
    probe = s1.request("POST", "/samples", sample)
    check(probe.status == 202, "POST /samples: %d %s" % (probe.status, probe.body[:300]))
    s = probe.json()["reserved_bytes"]
    s1.request("POST", "/jobs/%s/cancel" % probe.json()["id"])
    s1.wait_job(probe.json()["id"], lambda j: j["state"] == "canceled", what="probe canceled")
    check(s1.stop() == 0, "exit status")
    # the head H: the batch whose reservation lies nearest the middle of (r + s, 2r). Every
    # reservation holds the process baseline once (larger under ASan, and it differs between
    # machines), so the window moves against H's size: the batch is found, not fixed
    hb, h = None, None
    for b in range(small()["train"]["batch"] + 1, 129):
        nb = needed(batch=b)
        if r + s < nb < 2 * r and (h is None or abs(nb - (r + s + 2 * r) / 2) < abs(h - (r + s + 2 * r) / 2)):
            hb, h = b, nb
        if nb >= 2 * r:
            break
    check(s0.stop() == 0, "exit status")
    check(h is not None, "no batch makes the case: r=%d s=%d (r + s < h < 2r)" % (r, s))

    # the budget: A and S and one more small job, not H beside A
    budget = r + s + r + (1 << 20)
    release = os.path.join(tempfile.mkdtemp(prefix="ddpmd-hold-"), "release")
    srv = Server(exe, data=data, args=["--vram-budget", "cpu=%d" % budget],
                 env={"DDPMD_TEST_HOLD_STEP": "50", "DDPMD_TEST_HOLD_FILE": release}).start()
    srv.own_data = False
    over = []
    stop_watch = threading.Event()

    def watch():
        while not stop_watch.is_set():
            d = srv.get_json("/devices")["devices"][0]
            if d["reserved_bytes"] > d["budget_bytes"]:
                over.append(d)
            time.sleep(0.05)

    a = srv.request("POST", "/train", small(steps=100, checkpoint_every=0, log_every=1)).json()["id"]
    srv.wait_job(a, lambda j: j["step"] >= 3, what="A's first steps")
    t = threading.Thread(target=watch)
    t.start()
    hid = srv.request("POST", "/train", small(batch=hb, steps=100000, checkpoint_every=0)).json()["id"]
    c1 = srv.request("POST", "/train", small(steps=100000, checkpoint_every=0)).json()["id"]
    sid = srv.request("POST", "/samples", sample).json()["id"]
    c2 = srv.request("POST", "/train", small(steps=3, checkpoint_every=0)).json()["id"]

    srv.wait_job(sid, lambda j: j["state"] == "running", what="S backfilled by bytes")
    srv.wait_job(c2, lambda j: j["state"] == "succeeded", what="C2 backfilled by time, done")
    check(srv.get_json("/jobs/" + a)["state"] == "running", "A ended before the queue was decided")
    open(release, "w").close()  # A may run on to its end now
    # until H starts, C1 never runs (it would hold bytes the head needs when A ends)
    deadline = time.time() + 120
    while time.time() < deadline:
        jh = srv.get_json("/jobs/" + hid)
        j1 = srv.get_json("/jobs/" + c1)
        check(j1["state"] == "queued", "C1 (long, bytes the head needs) left the queue before the "
              "head: %s, head %s" % (j1["state"], jh["state"]))
        if jh["state"] != "queued":
            break
        time.sleep(0.05)
    check(jh["state"] == "running", "head %s" % jh["state"])
    ja = srv.get_json("/jobs/" + a)
    check(ja["state"] == "succeeded", "the head started before A ended: A %s" % ja["state"])
    jc2 = srv.get_json("/jobs/" + c2)
    check(jc2["ended_at"] <= ja["ended_at"] <= jh["started_at"],
          "C2 ended %s, A ended %s, H started %s" % (jc2["ended_at"], ja["ended_at"], jh["started_at"]))
    js = srv.get_json("/jobs/" + sid)
    check(js["started_at"] < ja["ended_at"] and js["started_at"] < jh["started_at"],
          "S (bytes the head does not need) was not backfilled: started %s, A ended %s, H started"
          " %s" % (js["started_at"], ja["ended_at"], jh["started_at"]))
    check(srv.get_json("/jobs/" + c1)["state"] == "queued", "C1 started beside the head")
    # the head leaves: C1 fits, and starts
    srv.request("POST", "/jobs/%s/cancel" % hid)
    srv.wait_job(c1, lambda j: j["state"] == "running", what="C1 after the head")
    for x in (c1, sid):
        srv.request("POST", "/jobs/%s/cancel" % x)
    for x in (c1, sid, hid):
        srv.wait_job(x, lambda j: j["state"] == "canceled", what="canceled")
    stop_watch.set()
    t.join()
    check(not over, "reservations over the budget: %s" % over[:3])
    check(srv.stop() == 0, "exit status")
    print("test_backfill: ok (r=%d s=%d h=%d at batch %d, budget=%d)" % (r, s, h, hb, budget))


if __name__ == "__main__":
    main(sys.argv[1])
