"""test_samples.py - sampling jobs over a real socket: train a tiny job, POST /samples from it
(by job and by checkpoint id), follow the job's events to the end, fetch and decode the grid and
one image (PNG signature, IHDR size = the grid's), the same seed gives the same bytes twice, a
different one other bytes; validation with field paths stores nothing; a running sampling job is
canceled through POST /jobs/{id}/cancel. The read routes of the same slice: GET /devices,
/datasets, /jobs/{id}/logs, loss.csv and loss.png. Usage: test_samples.py PATH/TO/ddpmd
"""
import struct
import sys
import time
import zlib

from serverlib import Server, check, need_fmnist, problem_ok, tiny, validate


def png_size(blob):
    check(blob[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature: %r" % blob[:8])
    (n,) = struct.unpack(">I", blob[8:12])
    check(blob[12:16] == b"IHDR" and n == 13, "the first chunk is not IHDR")
    w, h = struct.unpack(">II", blob[16:24])
    (crc,) = struct.unpack(">I", blob[29:33])
    check(crc == zlib.crc32(blob[12:29]) & 0xffffffff, "IHDR CRC wrong")
    check(blob[-12:-4] == b"\x00\x00\x00\x00IEND"[0:8], "does not end with IEND")
    return w, h


def wait_sample(s, sid, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = s.get_json("/samples/" + sid)
        validate(j, "Sample")
        if j["state"] in ("succeeded", "failed", "canceled"):
            return j
        time.sleep(0.1)
    check(False, "sample %s did not end" % sid)


def main(exe):
    need_fmnist()
    s = Server(exe).start()
    r = s.request("POST", "/train", tiny())
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="the training job succeeding")

    # the read routes around a job
    devs = s.get_json("/devices")
    validate(devs, "DeviceList")
    d = devs["devices"][0]
    check(d["name"] == "cpu" and d["reserved_bytes"] == 0 and d["free_bytes"] == d["budget_bytes"]
          and d["running_jobs"] == 0 and d["waiting_jobs"] == 0 and d["overhead_bytes"] > 0,
          "devices %s" % devs)
    ds = s.get_json("/datasets")
    validate(ds, "DatasetList")
    check(ds["datasets"][0]["id"] == "fashion-mnist" and ds["datasets"][0]["available"], "datasets %s" % ds)
    lg = s.request("GET", "/jobs/%s/logs" % jid)
    check(lg.status == 200 and lg.header("Content-Type").startswith("text/plain"), "logs %d" % lg.status)
    check(lg.body and s.data.encode() not in lg.body, "logs: empty or with a server path: %r" % lg.body[:300])
    evlog = [e[2]["line"] for e in s.events(jid)[0] if e[1] == "log"]
    check(lg.body.decode() == "".join(l + "\n" for l in evlog), "logs differ from the log events")
    csv = s.request("GET", "/jobs/%s/loss.csv" % jid)
    check(csv.status == 200 and csv.body.count(b"\n") >= 6, "loss.csv %d %r" % (csv.status, csv.body[:200]))
    lp = s.request("GET", "/jobs/%s/loss.png" % jid)
    check(lp.status == 200 and png_size(lp.body)[0] > 0, "loss.png %d" % lp.status)
    problem_ok(s.request("GET", "/jobs/j0000000000000000/logs"), 404)

    # a sample before the training job is read: 404 for a training job's id on /samples
    problem_ok(s.request("GET", "/samples/" + jid), 404)

    req = {"job": jid, "n": 4, "sampler": "ddim", "steps": 3, "seed": 7, "batch": 3, "ema": True}
    r = s.request("POST", "/samples", req)
    check(r.status == 202, "POST /samples: %d %s" % (r.status, r.body[:400]))
    smp = r.json()
    validate(smp, "Sample")
    sid = smp["id"]
    check(r.header("Location") == "/samples/" + sid, "Location %s" % r.header("Location"))
    check(smp["params"]["checkpoint"] == jid + "-6", "params %s" % smp["params"])
    parts = smp["plan"]["parts"]["device"]
    check(smp["plan"]["plan_bytes"] > 0 and parts["gradients"] == 0 and
          parts["optimizer"] == 0 and parts["ema"] == 0,
          "the sampling plan holds training state: %s" % smp["plan"])
    check(smp["reserved_bytes"] >= smp["plan"]["plan_bytes"], "reserved %s" % smp)
    check(s.data not in r.body.decode(), "a server path in the sample")

    evs, _ = s.events(sid)
    states = [e[2]["state"] for e in evs if e[1] == "state"]
    check(states == ["queued", "running", "succeeded"], "states %s (events %s)" % (states, evs[-3:]))
    prog = [(e[2]["done"], e[2]["total"]) for e in evs if e[1] == "progress"]
    # rate-limited (one per 500 ms): the first and the last denoising step are always there
    check(prog and prog[0] == (1, 6) and prog[-1] == (6, 6) and
          [p[0] for p in prog] == sorted(set(p[0] for p in prog)), "progress %s" % prog)
    logs = " ".join(e[2]["line"] for e in evs if e[1] == "log")
    check(s.data not in logs and "DATA" not in logs and "out/" not in logs,
          "a server path in the sample's log events: %s" % logs[:300])

    done = wait_sample(s, sid)
    check(done["state"] == "succeeded" and done["step"] == 6 and done["steps"] == 6, "sample %s" % done)
    check(done["images"] == ["/samples/%s/images/%d.png" % (sid, k) for k in range(4)],
          "images %s" % done["images"])
    check(done["links"]["grid"] == "/samples/%s.png" % sid, "links %s" % done["links"])
    validate(s.get_json("/jobs/" + sid), "Job")

    g = s.request("GET", "/samples/%s.png" % sid)
    check(g.status == 200 and g.header("Content-Type") == "image/png", "grid: %d" % g.status)
    check(png_size(g.body) == (2 * 32 + 2, 2 * 32 + 2), "grid size %s" % (png_size(g.body),))
    im = s.request("GET", "/samples/%s/images/3.png" % sid)
    check(im.status == 200 and png_size(im.body) == (32, 32), "image 3: %d" % im.status)
    for bad in ("4", "03", "-1", "x", "1.png.png"):
        problem_ok(s.request("GET", "/samples/%s/images/%s.png" % (sid, bad)), 404)

    # the same request by checkpoint id, another batch: the same bytes; another seed: others
    again = dict(req, batch=1)
    del again["job"]
    again["checkpoint"] = jid + "-6"
    r2 = s.request("POST", "/samples", again)
    check(r2.status == 202, "POST /samples again: %d %s" % (r2.status, r2.body[:300]))
    sid2 = r2.json()["id"]
    check(wait_sample(s, sid2)["state"] == "succeeded", "second sample failed")
    g2 = s.request("GET", "/samples/%s.png" % sid2)
    check(g2.body == g.body, "the same seed gave other bytes")
    r3 = s.request("POST", "/samples", dict(req, seed=8))
    sid3 = r3.json()["id"]
    check(wait_sample(s, sid3)["state"] == "succeeded", "third sample failed")
    check(s.request("GET", "/samples/%s.png" % sid3).body != g.body, "another seed, the same bytes")

    # listing and paging
    lst = s.get_json("/samples")
    validate(lst, "SampleList")
    check([x["id"] for x in lst["samples"]] == [sid, sid2, sid3], "GET /samples %s" % lst)
    page = s.get_json("/samples?limit=2")
    check(page["next"] == sid2 and len(page["samples"]) == 2, "page %s" % page)
    rest = s.get_json("/samples?limit=2&after=" + page["next"])
    check([x["id"] for x in rest["samples"]] == [sid3] and rest["next"] is None, "rest %s" % rest)
    kinds = s.get_json("/jobs?kind=train")
    check([x["id"] for x in kinds["jobs"]] == [jid], "GET /jobs?kind=train %s" % kinds)
    validate(s.get_json("/jobs"), "JobList")

    # validation: field paths, nothing stored
    bad = [
        ({"job": jid, "n": 0}, "n"),
        ({"job": jid, "sampler": "euler"}, "sampler"),
        ({"job": jid, "eta": 2}, "eta"),
        ({"job": jid, "ema": "yes"}, "ema"),
        ({"job": jid, "seed": -1}, "seed"),
        ({"job": jid, "batch": 1.5}, "batch"),
        ({"job": jid, "colour": 1}, "colour"),
        ({"job": jid, "checkpoint": jid + "-6"}, "job"),
        ({}, "checkpoint"),
        ({"checkpoint": "/etc/passwd"}, "checkpoint"),
        ({"checkpoint": jid + "-5"}, "checkpoint"),
        ({"job": "j0000000000000000"}, "job"),
        ({"job": sid}, "job"),
        ({"job": jid, "steps": 100000}, "steps"),
    ]
    for body, path in bad:
        problem_ok(s.request("POST", "/samples", body), 422, path)
    problem_ok(s.request("POST", "/samples", "[1,", headers={"Content-Type": "application/json"}), 400)
    problem_ok(s.request("POST", "/samples", "{}", headers={"Content-Type": "text/plain"}), 415)
    check(len(s.get_json("/samples")["samples"]) == 3, "a refused sample was stored")

    # cancel a running sampling job: ddpm walks every timestep, long enough to catch it
    r = s.request("POST", "/samples", {"job": jid, "n": 2, "sampler": "ddpm", "batch": 2})
    check(r.status == 202, "POST /samples ddpm: %d %s" % (r.status, r.body[:300]))
    cid = r.json()["id"]
    s.wait_job(cid, lambda j: j["state"] == "running" and j["step"] > 0, what="sampling progress")
    c = s.request("POST", "/jobs/%s/cancel" % cid)
    check(c.status == 202, "cancel: %d %s" % (c.status, c.body[:300]))
    end = wait_sample(s, cid)
    check(end["state"] == "canceled" and end["images"] == [] and end["links"]["grid"] is None,
          "canceled sample %s" % end)
    problem_ok(s.request("GET", "/samples/%s.png" % cid), 409)
    problem_ok(s.request("POST", "/jobs/%s/cancel" % cid), 409)
    check(s.get_json("/healthz")["status"] == "ok", "healthz after")
    problem_ok(s.request("GET", "/jobs/%s/loss.csv" % cid), 404)  # a sampling job has none
    d = s.get_json("/devices")["devices"][0]
    check(d["reserved_bytes"] == 0 and d["running_jobs"] == 0, "devices after %s" % d)
    print("test_samples: ok")


if __name__ == "__main__":
    main(sys.argv[1])
