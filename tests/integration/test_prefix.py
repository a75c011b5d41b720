"""test_prefix.py - `ddpmd serve --path-prefix /ddpmd` over a real socket: requests are routed both
with the prefix and without it (a proxy that strips it), every URL the server sends carries it
(Location of POST /train and POST /samples, the links of jobs and samples, the images of a sample,
the checkpoint list's urls, the url of a checkpoint event) and each such URL, followed as given,
answers; GET /openapi.yaml names the prefix as its server; DDPMD_PATH_PREFIX sets it, the option
overrides the environment; prefixes that are no path, or that begin like a route, are refused at
start. Usage: test_prefix.py PATH/TO/ddpmd
"""
import subprocess
import sys

import yaml

from serverlib import OPENAPI, ROOT, Server, check, need_fmnist, problem_ok, tiny, validate
from test_samples import png_size, wait_sample

P = "/ddpmd"


def follow(s, url):
    """GET url exactly as the server gave it (already prefixed), not under s.prefix"""
    saved, s.prefix = s.prefix, ""
    try:
        return s.request("GET", url)
    finally:
        s.prefix = saved


def served_openapi(s):
    r = follow(s, s.prefix + "/openapi.yaml")
    check(r.status == 200, "GET openapi.yaml: %d" % r.status)
    return r.body.decode()


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--path-prefix", P + "/"]).start()  # a trailing slash is the same prefix
    s.prefix = P
    r = s.request("POST", "/train", tiny())
    check(r.status == 202, "POST %s/train: %d %s" % (P, r.status, r.body[:300]))
    job = r.json()
    validate(job, "Job")
    jid = job["id"]
    check(r.header("Location") == P + "/jobs/" + jid, "Location %s" % r.header("Location"))
    want = {"self": P + "/jobs/" + jid, "checkpoint": None, "export": None}
    for k, tail in [("events", "/events"), ("logs", "/logs"), ("loss_png", "/loss.png"),
                    ("loss_csv", "/loss.csv"), ("grids", "/grids/{step}.png"),
                    ("checkpoints", "/checkpoints")]:
        want[k] = P + "/jobs/" + jid + tail
    check(job["links"] == want, "links %s" % job["links"])

    evs, hdrs = s.events(jid)
    h = {k.lower(): v for k, v in hdrs}
    check(h.get("x-accel-buffering") == "no", "the event stream lacks X-Accel-Buffering: no: %s" % h)
    check(h.get("content-type", "").startswith("text/event-stream"), "content type %s" % h)
    ck = [e[2] for e in evs if e[1] == "checkpoint"]
    check([c["id"] for c in ck] == [jid + "-3", jid + "-6"], "checkpoint events %s" % ck)
    for c in ck:
        check(c["url"] == P + "/checkpoints/" + c["id"], "checkpoint event url %s" % c)
    states = [e[2]["state"] for e in evs if e[1] == "state"]
    check(states[-1] == "succeeded", "states %s" % states)

    # the same job without the prefix (what the server sees behind a stripping proxy): the links
    # still name the public URL
    s.prefix = ""
    j = s.get_json("/jobs/" + jid)
    want.update(checkpoint=P + "/checkpoints/%s-6" % jid,
                export=P + "/checkpoints/%s-6?format=diffusers" % jid)
    check(j["links"] == want, "links without the prefix %s" % j["links"])
    lst = s.get_json(P + "/jobs")
    check([x["links"]["self"] for x in lst["jobs"]] == [P + "/jobs/" + jid], "list %s" % lst)
    s.prefix = P

    cks = s.get_json("/jobs/%s/checkpoints" % jid)
    validate(cks, "CheckpointList")
    check([c["url"] for c in cks["checkpoints"]] == [P + "/checkpoints/%s-%d" % (jid, n) for n in (3, 6)],
          "checkpoint urls %s" % cks)
    for c in cks["checkpoints"]:
        d = follow(s, c["url"])
        check(d.status == 200 and len(d.body) == c["bytes"], "GET %s: %d, %d bytes" % (c["url"], d.status, len(d.body)))
    d = follow(s, ck[-1]["url"])
    check(d.status == 200 and d.body == follow(s, cks["checkpoints"][-1]["url"]).body, "the event's url")

    r = s.request("POST", "/samples", {"job": jid, "n": 2, "steps": 2, "batch": 2})
    check(r.status == 202, "POST %s/samples: %d %s" % (P, r.status, r.body[:300]))
    sid = r.json()["id"]
    check(r.header("Location") == P + "/samples/" + sid, "Location %s" % r.header("Location"))
    smp = wait_sample(s, sid)
    check(smp["state"] == "succeeded", "sample %s" % smp)
    check(smp["images"] == [P + "/samples/%s/images/%d.png" % (sid, k) for k in range(2)], "images %s" % smp["images"])
    check(smp["links"] == {"self": P + "/samples/" + sid, "grid": P + "/samples/%s.png" % sid,
                           "events": P + "/jobs/%s/events" % sid, "cancel": P + "/jobs/%s/cancel" % sid},
          "sample links %s" % smp["links"])
    w, hh = png_size(follow(s, smp["links"]["grid"]).body)
    check(w > 0 and hh > 0, "grid")
    for u in smp["images"]:
        check(png_size(follow(s, u).body) == (32, 32), "image %s" % u)
    c = s.request("POST", "/jobs/%s/cancel" % jid)
    problem_ok(c, 409)

    # the served document names the prefix and is otherwise the file
    doc = served_openapi(s)
    check(yaml.safe_load(doc)["servers"] == [{"url": P}], "servers %s" % yaml.safe_load(doc).get("servers"))
    src = open(ROOT + "/openapi.yaml").read()
    check(doc == src.replace("\nservers: [{url: /}]\n", "\nservers: [{url: %s}]\n" % P), "the served openapi.yaml differs")
    check(OPENAPI["servers"] == [{"url": "/"}], "openapi.yaml's own servers entry %s" % OPENAPI.get("servers"))

    # only the prefix itself followed by '/' is stripped, once
    s.prefix = ""
    problem_ok(s.request("GET", P + "x/jobs"), 404)
    problem_ok(s.request("GET", P + P + "/jobs"), 404)
    r = s.request("POST", P + "/jobs")
    problem_ok(r, 405)
    check(r.header("Allow") == "GET, HEAD", "Allow %s" % r.header("Allow"))
    check(s.request("GET", P + "/healthz").status == 200 and s.request("GET", "/healthz").status == 200, "healthz")
    s.stop()

    # the environment sets it; the option overrides the environment
    e = Server(exe, env={"DDPMD_PATH_PREFIX": "/a/b"}).start()
    e.prefix = "/a/b"
    check(e.request("GET", "/healthz").status == 200, "healthz under /a/b")
    check(yaml.safe_load(served_openapi(e))["servers"] == [{"url": "/a/b"}], "servers under DDPMD_PATH_PREFIX")
    e.stop()
    o = Server(exe, env={"DDPMD_PATH_PREFIX": "/a/b"}, args=["--path-prefix", "/"]).start()
    check(served_openapi(o) == src, "--path-prefix / (none) over the environment: the file as it is")
    problem_ok(o.request("GET", "/a/b/healthz"), 404)
    o.stop()

    for bad in ["/jobs", "/samples/x", "/healthz", "ddpmd", "/a//b", "/a b", "/..", "/a%2Fb", "/" + "x" * 64]:
        p = subprocess.run([exe, "serve", "--listen", "127.0.0.1:0", "--data", "/nonexistent/ddpmd-prefix",
                            "--path-prefix", bad], capture_output=True, timeout=30)
        check(p.returncode == 2 and b"--path-prefix" in p.stderr and not p.stdout,
              "--path-prefix %r: exit %d, %r" % (bad, p.returncode, p.stderr[:200]))
    print("ok: test_prefix")


if __name__ == "__main__":
    main(sys.argv[1])
