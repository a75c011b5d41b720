"""test_flow.py - the curl flow over a real socket: POST /train a tiny fashion-mnist job, follow
its event stream to the end, list and download its checkpoint (safetensors header checked),
resume the stream with Last-Event-ID, cancel a running job; every JSON body is checked against
openapi.yaml. Usage: test_flow.py PATH/TO/ddpmd
"""
import json
import struct
import subprocess
import sys

from serverlib import Server, check, need_fmnist, problem_ok, tiny, validate


def safetensors_ok(blob):
    check(len(blob) > 8, "checkpoint too short")
    (n,) = struct.unpack("<Q", blob[:8])
    check(8 + n <= len(blob), "header length %d beyond the file" % n)
    hdr = json.loads(blob[8:8 + n])
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1}
    end = 0
    tensors = 0
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        numel = 1
        for d in t["shape"]:
            numel *= d
        check(b - a == numel * sizes[t["dtype"]], "%s: %d bytes for shape %s" % (name, b - a, t["shape"]))
        end = max(end, b)
        tensors += 1
    check(8 + n + end == len(blob), "tensor data ends at %d, file is %d" % (8 + n + end, len(blob)))
    check("conv_in.weight" in hdr and hdr["conv_in.weight"]["shape"] == [32, 1, 3, 3],
          "conv_in.weight missing or wrong: %s" % hdr.get("conv_in.weight"))
    check("__metadata__" in hdr, "no metadata (the spec and step)")
    return tensors


def main(exe):
    need_fmnist()
    s = Server(exe).start()

    # the served contract is the file's
    r = s.request("GET", "/openapi.yaml")
    check(r.status == 200 and r.body == open(s_root() + "/openapi.yaml", "rb").read(),
          "GET /openapi.yaml differs from openapi.yaml")
    check(s.get_json("/healthz")["status"] == "ok", "healthz")
    # one server per data directory
    p = subprocess.run([exe, "serve", "--listen", "127.0.0.1:0", "--data", s.data],
                       capture_output=True, timeout=60)
    check(p.returncode == 1 and b"another ddpmd serve" in p.stderr,
          "a second server on the same data: %d %s" % (p.returncode, p.stderr))
    validate(s.get_json("/readyz"), "Ready")

    r = s.request("POST", "/train", tiny())
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:400]))
    job = r.json()
    validate(job, "Job")
    jid = job["id"]
    check(r.header("Location") == "/jobs/" + jid, "Location %s" % r.header("Location"))
    check(job["state"] in ("queued", "running"), "state %s" % job["state"])
    check(job["plan"]["plan_bytes"] > 0 and job["reserved_bytes"] >= job["plan"]["plan_bytes"],
          "plan %s" % job["plan"])

    evs, hdrs = s.events(jid)
    h = {k.lower(): v for k, v in hdrs}
    check(h.get("content-type", "").startswith("text/event-stream"), "SSE content type %s" % h)
    check(h.get("x-accel-buffering") == "no", "no X-Accel-Buffering: no")
    ids = [e[0] for e in evs]
    check(ids == list(range(1, len(ids) + 1)), "event ids not 1..n: %s" % ids)
    states = [e[2]["state"] for e in evs if e[1] == "state"]
    check(states == ["queued", "running", "succeeded"], "states %s" % states)
    steps = [e[2]["step"] for e in evs if e[1] == "progress" and e[2].get("event") == "step"]
    # at most one step event per 500 ms: the first, the last and those in between that were due
    check(steps[0] == 1 and steps[-1] == 6 and steps == sorted(set(steps)), "progress steps %s" % steps)
    ckpts = [e[2]["id"] for e in evs if e[1] == "checkpoint"]
    check(ckpts and ckpts[-1] == jid + "-6", "checkpoint events %s" % ckpts)
    check(evs[-1][1] == "state", "the stream does not end with the final state")
    logs = " ".join(e[2]["line"] for e in evs if e[1] == "log")
    check(s.data not in logs, "a server path in the job's log events: %s" % logs[:300])

    j = s.get_json("/jobs/" + jid)
    validate(j, "Job")
    check(j["state"] == "succeeded" and j["step"] == 6 and j["steps"] == 6, "job %s" % j)
    check(j["threads"] == 1 and j["error"] is None and j["loss"] > 0, "job %s" % j)

    cl = s.get_json("/jobs/%s/checkpoints" % jid)
    validate(cl, "CheckpointList")
    check([c["step"] for c in cl["checkpoints"]] == [3, 6], "checkpoints %s" % cl)
    r = s.request("GET", cl["checkpoints"][-1]["url"])
    check(r.status == 200, "download: %d" % r.status)
    check(len(r.body) == cl["checkpoints"][-1]["bytes"], "download size")
    safetensors_ok(r.body)
    full, url, etag = r.body, cl["checkpoints"][-1]["url"], r.header("ETag")
    check(etag and r.header("Accept-Ranges") == "bytes", "ETag %s, Accept-Ranges %s"
          % (etag, r.header("Accept-Ranges")))
    r = s.request("GET", url, headers={"Range": "bytes=0-7"})
    check(r.status == 206 and r.body == full[:8] and
          r.header("Content-Range") == "bytes 0-7/%d" % len(full), "range 0-7: %d %s" % (r.status, r.header("Content-Range")))
    r = s.request("GET", url, headers={"Range": "bytes=-16"})
    check(r.status == 206 and r.body == full[-16:], "suffix range: %d" % r.status)
    r = s.request("GET", url, headers={"Range": "bytes=100-"})
    check(r.status == 206 and r.body == full[100:], "open range: %d" % r.status)
    problem_ok(s.request("GET", url, headers={"Range": "bytes=%d-" % len(full)}), 416)
    r = s.request("GET", url, headers={"Range": "bytes=0-1,5-6"})
    check(r.status == 200 and r.body == full, "several ranges: the whole file (%d)" % r.status)
    r = s.request("GET", url, headers={"Range": "bytes=0-7", "If-Range": '"other"'})
    check(r.status == 200 and r.body == full, "If-Range of another version: the whole file")
    r = s.request("GET", url, headers={"If-None-Match": etag})
    check(r.status == 304 and r.body == b"", "If-None-Match: %d" % r.status)

    # Last-Event-ID: only what came after
    tail, _ = s.events(jid, last_event_id=ids[-3])
    check([e[0] for e in tail] == ids[-2:], "resume after %d gave %s" % (ids[-3], [e[0] for e in tail]))

    page = s.get_json("/jobs?state=succeeded&limit=1")
    validate(page, "JobList")
    check([x["id"] for x in page["jobs"]] == [jid] and page["next"] == jid, "list %s" % page)
    page2 = s.get_json("/jobs?state=succeeded&limit=1&after=" + jid)
    check(page2["jobs"] == [] and page2["next"] is None, "second page %s" % page2)

    # fine-tuning from that checkpoint, named by its id (the job shows the id, never a path)
    ft = tiny(steps=2, checkpoint_every=0)
    ft["init_from"] = jid + "-6"
    r = s.request("POST", "/train", ft)
    check(r.status == 202, "init_from by id: %d %s" % (r.status, r.body[:300]))
    fj = r.json()
    check(fj["spec"]["init_from"] == ft["init_from"], "shown init_from %s" % fj["spec"]["init_from"])
    fj = s.wait_job(fj["id"], lambda j: j["state"] == "succeeded", what="fine-tuning succeeded")
    check(fj["step"] == 2, "fine-tuning steps %d" % fj["step"])

    # cancel a running job: it stops at its next step with a checkpoint
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=0))
    check(r.status == 202, "POST /train (long): %d %s" % (r.status, r.body[:300]))
    lid = r.json()["id"]
    s.wait_job(lid, lambda j: j["step"] >= 1, what="a first step")
    r = s.request("POST", "/jobs/%s/cancel" % lid)
    check(r.status == 202 and r.json()["cancel_requested"], "cancel running: %d %s" % (r.status, r.body[:300]))
    evs, _ = s.events(lid)
    check(evs[-1][1] == "state" and evs[-1][2]["state"] == "canceled", "last event %s" % (evs[-1],))
    j = s.get_json("/jobs/" + lid)
    check(j["state"] == "canceled", "state %s" % j["state"])
    cl = s.get_json("/jobs/%s/checkpoints" % lid)["checkpoints"]
    check(len(cl) == 1 and cl[0]["step"] == j["step"], "the stop's checkpoint: %s (step %d)" % (cl, j["step"]))
    p = problem_ok(s.request("POST", "/jobs/%s/cancel" % lid), 409)
    check(p["state"] == "canceled", "409 body %s" % p)

    # a cancel before the job's process has set up its SIGINT handler ends canceled too
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=0))
    check(r.status == 202, "POST /train (cancel at once): %d" % r.status)
    qid = r.json()["id"]
    r = s.request("POST", "/jobs/%s/cancel" % qid)
    check(r.status in (200, 202), "cancel at once: %d %s" % (r.status, r.body[:300]))
    j = s.wait_job(qid, lambda j: j["state"] == "canceled", timeout=60, what="canceled")
    check(j["error"] is None, "error of a canceled job: %s" % j["error"])

    # a job that fails in its process: failed, with the exit status and its last stderr lines
    r = s.request("POST", "/train", dict(tiny(), data={"dataset": "fashion-mnist", "validation": 70000}))
    check(r.status == 202, "POST /train (failing): %d %s" % (r.status, r.body[:300]))
    fid = r.json()["id"]
    evs, _ = s.events(fid)
    j = s.get_json("/jobs/" + fid)
    check(j["state"] == "failed" and "exit status 1" in j["error"] and
          "leaves no training images" in j["error"], "failed job: %s / %s" % (j["state"], j["error"]))
    check(evs[-1][2] == {"state": "failed", "error": j["error"]}, "last event %s" % (evs[-1],))
    check(s.get_json("/healthz")["status"] == "ok", "healthy after a failed job")

    check(s.stop() == 0, "server exit status")
    print("test_flow: ok")


def s_root():
    import serverlib
    return serverlib.ROOT


if __name__ == "__main__":
    main(sys.argv[1])
