"""test_admission.py - admission by planned bytes on a cpu device: a job that can never fit gets
422 with the bytes it needs and leaves no row and no folder; a job with memory auto is fitted to
a budget between its smallest and its plain plan, and its process runs exactly the admitted plan
(the strategy in its spec, the device bytes it allocates); with a budget that holds one job
but not two the second waits queued while the first runs and starts when the first ends; a
full queue answers 503 with Retry-After; a queued job cancels at once. Usage: test_admission.py
PATH/TO/ddpmd
"""
import http.client
import json
import os
import re
import struct
import sys
import time

from serverlib import Server, check, need_fmnist, problem_ok, tiny


def keepalive_seen(s, job):
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
    c.request("GET", "/jobs/%s/events" % job)
    r = c.getresponse()
    deadline = time.time() + 15
    while time.time() < deadline:
        line = r.readline()
        if line.startswith(b": keep-alive"):
            c.close()
            return True
        if not line:
            break
    c.close()
    return False


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--vram-budget", "cpu=1MiB"]).start()
    p = problem_ok(s.request("POST", "/train", tiny()), 422)
    check(p["type"].endswith("never-fits"), "type %s" % p["type"])
    need = p["needed_bytes"]
    check(need > 1 << 20 and p["budget_bytes"] == 1 << 20, "needed %s" % p)
    check(p["plan"]["plan_bytes"] > 0 and p["plan"]["reserved_bytes"] == need, "plan %s" % p["plan"])
    check(s.get_json("/jobs")["jobs"] == [], "a refused job left a row")
    check(os.listdir(os.path.join(s.data, "jobs")) == [], "a refused job left a folder")
    # memory auto is fitted at submit: the smallest plan's bytes (auto) and the plain one's
    fit = tiny(steps=2, batch=8, checkpoint_every=0)
    small = problem_ok(s.request("POST", "/train", fit), 422)["plan"]
    plain = dict(fit, memory={"precision": "f32", "micro_batch": 8, "recompute": "none",
                              "offload": "off"})
    big = problem_ok(s.request("POST", "/train", plain), 422)["plan"]
    check(small["reserved_bytes"] < big["reserved_bytes"], "smallest %s, plain %s" % (small, big))
    check(s.stop() == 0, "exit status")

    # a budget between them: admitted with a smaller strategy than the plain one, and the job's
    # process runs exactly that plan (its spec's memory, the device bytes it allocates)
    mid = (small["reserved_bytes"] + big["reserved_bytes"]) // 2
    sf = Server(exe, args=["--vram-budget", "cpu=%d" % mid]).start()
    r = sf.request("POST", "/train", fit)
    check(r.status == 202, "fitted job: %d %s" % (r.status, r.body[:300]))
    j = r.json()
    st = j["plan"]["strategy"]
    check(j["plan"]["fits"] and j["plan"]["reserved_bytes"] <= mid and st != plain["memory"] and
          j["plan"]["search"]["candidates"][-1]["chosen"], "fitted plan %s" % j["plan"])
    sf.wait_job(j["id"], lambda x: x["state"] == "succeeded", what="the fitted job done")
    # the child's spec file is the spec as submitted, written once; the plan reaches the child
    # on its command line, and the spec it ran with is in its checkpoint's metadata
    written = json.load(open(os.path.join(sf.data, "jobs", j["id"], "spec.json")))
    check(written["memory"]["precision"] == "auto" and written["memory"]["vram_budget"] == 0,
          "the child's spec file was changed: %s" % written["memory"])
    ckdir = os.path.join(sf.data, "jobs", j["id"], "out", "checkpoints")
    with open(os.path.join(ckdir, sorted(os.listdir(ckdir))[-1]), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    child = json.loads(header["__metadata__"]["spec"])
    check({k: child["memory"][k] for k in st} == st and
          child["memory"]["vram_budget"] == j["plan"]["vram_budget"],
          "the child's memory %s, the plan's %s" % (child["memory"], st))
    logs = sf.request("GET", "/jobs/%s/logs" % j["id"]).body.decode()
    m = re.search(r"device total +(\d+) bytes", logs)
    check(m and int(m.group(1)) == j["plan"]["plan_bytes"], "the child allocated %s, the plan says %d"
          % (m and m.group(1), j["plan"]["plan_bytes"]))
    check(st["micro_batch"] == 8 or "micro-batches of %d" % st["micro_batch"] in logs,
          "the child's micro-batches: %s" % logs[:600])
    check(sf.stop() == 0, "exit status")

    # room for one job and a half: the second must wait for the first
    budget = need * 3 // 2
    s2 = Server(exe, args=["--vram-budget", "cpu=%d" % budget, "--max-queue", "1",
                           "--sse-keepalive", "1"]).start()
    long = tiny(steps=100000, checkpoint_every=0)
    a = s2.request("POST", "/train", long).json()["id"]
    s2.wait_job(a, lambda j: j["state"] == "running", what="running")
    r = s2.request("POST", "/train", long)
    check(r.status == 202, "second job: %d %s" % (r.status, r.body[:300]))
    b = r.json()["id"]
    # while a makes progress, b stays queued: the budget holds one reservation
    step0 = s2.get_json("/jobs/" + a)["step"]
    s2.wait_job(a, lambda j: j["step"] >= step0 + 3, what="three more steps")
    check(s2.get_json("/jobs/" + b)["state"] == "queued", "b started beside a")
    # the queued job's stream is quiet: a keep-alive comment comes (every second here)
    check(keepalive_seen(s2, b), "no keep-alive comment on a quiet event stream")
    ready = s2.get_json("/readyz")["devices"][0]
    check(ready["reserved_bytes"] == s2.get_json("/jobs/" + a)["reserved_bytes"], "reserved %s" % ready)
    check(ready["reserved_bytes"] <= ready["budget_bytes"], "over budget %s" % ready)
    # the queue (max 1) is full
    r = s2.request("POST", "/train", long)
    problem_ok(r, 503)
    check(r.header("Retry-After"), "503 without Retry-After")
    # a queued job cancels at once; then c takes its place in the queue
    r = s2.request("POST", "/jobs/%s/cancel" % b)
    check(r.status == 200 and r.json()["state"] == "canceled", "cancel queued: %d %s" % (r.status, r.body[:200]))
    r = s2.request("POST", "/train", long)
    check(r.status == 202, "third job: %d" % r.status)
    c = r.json()["id"]
    check(s2.get_json("/jobs/" + c)["state"] == "queued", "c started beside a")
    # a restart keeps the queue: a (running) resumes, c (queued) stays queued behind it
    check(s2.stop() == 0, "exit status at the restart")
    s2 = Server(exe, data=s2.data, args=s2.args).start()
    s2.wait_job(a, lambda j: j["state"] == "running" and j["starts"] == 2, what="a resumed")
    check(s2.get_json("/jobs/" + c)["state"] == "queued", "c after the restart")
    check(s2.get_json("/jobs/" + b)["state"] == "canceled", "b after the restart")
    # a ends: c starts
    check(s2.request("POST", "/jobs/%s/cancel" % a).status == 202, "cancel a")
    s2.wait_job(a, lambda j: j["state"] == "canceled", what="a canceled")
    s2.wait_job(c, lambda j: j["state"] == "running", what="c running")
    check(s2.request("POST", "/jobs/%s/cancel" % c).status == 202, "cancel c")
    s2.wait_job(c, lambda j: j["state"] == "canceled", what="c canceled")
    check(s2.get_json("/readyz")["devices"][0]["reserved_bytes"] == 0, "reservations left over")
    check(s2.stop() == 0, "exit status")

    # cores divided among running jobs: 3 cores, two jobs asking for 2 threads each get 2 and 1,
    # fixed at their start
    s3 = Server(exe, args=["--cpu-cores", "3"]).start()
    two = tiny(steps=100000, checkpoint_every=0, threads=2)
    x = s3.request("POST", "/train", two).json()["id"]
    s3.wait_job(x, lambda j: j["state"] == "running", what="x running")
    y = s3.request("POST", "/train", two).json()["id"]
    jy = s3.wait_job(y, lambda j: j["state"] == "running", what="y running")
    check(s3.get_json("/jobs/" + x)["threads"] == 2 and jy["threads"] == 1,
          "threads %s, %s" % (s3.get_json("/jobs/" + x)["threads"], jy["threads"]))
    check(s3.get_json("/readyz")["devices"][0]["threads_used"] == 3, "threads used")
    for j in (x, y):
        s3.request("POST", "/jobs/%s/cancel" % j)
    for j in (x, y):
        s3.wait_job(j, lambda j: j["state"] == "canceled", what="canceled")
    check(s3.stop() == 0, "exit status")
    print("test_admission: ok")


if __name__ == "__main__":
    main(sys.argv[1])
