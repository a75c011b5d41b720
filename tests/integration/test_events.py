"""test_events.py - a job's event log under a fast job: a tiny model at 8 px with log_every 1
(about a thousand steps a second) stores a few progress events a second, not one a step, and
kilobytes of database, not megabytes; the last step, every checkpoint, grid and state change
are kept; every event's data matches its schema in openapi.yaml (x-events); no event names a
server path; Last-Event-ID and last_event_id are both checked and the header wins. The spec
names no train.threads: the job gets the server's free cores (--cpu-cores 3), recorded in the
job and in its checkpoints.
Usage: test_events.py PATH/TO/ddpmd
"""
import json
import os
import struct
import sqlite3
import sys
import time

import yaml

from serverlib import OPENAPI, Server, check, need_fmnist, problem_ok, validate

STEPS = 3000

FAST = {
    "model": {"preset": "ddpm", "in_channels": 1, "image_size": 8, "block_out_channels": [8],
              "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4},
    "data": {"dataset": "fashion-mnist", "fmnist_resize": "resize"},
    "train": {"batch": 1, "steps": STEPS, "threads": 1, "warmup": 1},
    "output": {"checkpoint_every": 1000, "sample_every": 1500, "log_every": 1, "keep_last": 1,
               "samples": 1},
}


def event_bytes(data_dir, jid):
    """the bytes of the job's event rows and how many there are (read-only, beside the server)"""
    db = sqlite3.connect("file:%s/ddpmd.db?mode=ro" % data_dir, uri=True)
    n, b = db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(job_id) + 8 + LENGTH(type) + "
                      "LENGTH(data) + LENGTH(at)), 0) FROM events WHERE job_id = ?",
                      (jid,)).fetchone()
    db.close()
    return n, b


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--cpu-cores", "3"]).start()
    t0 = time.time()
    r = s.request("POST", "/train", FAST)
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    evs, _ = s.events(jid, timeout=200)
    wall = time.time() - t0
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded" and j["step"] == STEPS, "job %s" % j)

    # every event's data is the schema its type names in openapi.yaml
    xev = OPENAPI["paths"]["/jobs/{id}/events"]["get"]["responses"]["200"]["content"][
        "text/event-stream"]["x-events"]
    for ev in evs:
        check(ev[1] in xev, "event type %s is not documented in x-events" % ev[1])
        validate(ev[2], xev[ev[1]]["$ref"].rsplit("/", 1)[1])
    ids = [e[0] for e in evs]
    check(ids == sorted(set(ids)), "event ids do not grow: %s" % ids)

    prog = [e[2] for e in evs if e[1] == "progress"]
    steps = [p["step"] for p in prog if p["event"] == "step"]
    n_db, b_db = event_bytes(s.data, jid)
    files = sum(os.path.getsize(os.path.join(s.data, f)) for f in ("ddpmd.db", "ddpmd.db-wal")
                if os.path.exists(os.path.join(s.data, f)))
    print("%d steps in %.1f s: %d events (%d progress, %d of them steps), %d event rows of %d "
          "bytes; ddpmd.db and its WAL %d bytes" % (STEPS, wall, len(evs), len(prog), len(steps), n_db, b_db,
                                         files))
    # at most one a kind per 500 ms, plus the kept ones: three validation steps (the checkpoints)
    # and the ends of the grids' phases
    check(len(steps) <= 2 * wall + 3 + 3, "%d step events in %.1f s" % (len(steps), wall))
    check(len(prog) <= 3 * (2 * wall + 3) + 3, "%d progress events in %.1f s" % (len(prog), wall))
    check(steps and steps[-1] == STEPS and steps == sorted(steps), "steps %s" % steps[-5:])
    check(b_db < 64 * 1024, "%d bytes of events for a %d-step job" % (b_db, STEPS))
    check([e[2]["step"] for e in evs if e[1] == "checkpoint"] == [1000, 2000, 3000],
          "checkpoints %s" % [e[2] for e in evs if e[1] == "checkpoint"])
    samples = [e[2] for e in evs if e[1] == "sample"]
    check([x["step"] for x in samples] == [1500, 3000] and
          samples[0]["url"] == "/jobs/%s/grids/1500.png" % jid, "samples %s" % samples)
    check(s.request("GET", samples[-1]["url"]).status == 200, "the sample's url")
    check([e[2]["state"] for e in evs if e[1] == "state"] == ["queued", "running", "succeeded"],
          "states")
    check([x["event"] for x in (e[2] for e in evs) if x.get("event") in ("done", "stopped")] ==
          ["done"], "the end")

    # no thread count named: the cores free at its start, in the job, its events, its checkpoint
    auto = json.loads(json.dumps(FAST))
    del auto["train"]["threads"]
    auto["train"]["steps"] = 3
    auto["output"].update(checkpoint_every=3, sample_every=0)
    aid = s.request("POST", "/train", auto).json()["id"]
    aevs, _ = s.events(aid)
    ja = s.get_json("/jobs/" + aid)
    check(ja["state"] == "succeeded" and ja["threads"] == 3, "job %s: %s, threads %s with 3 free "
          "cores" % (aid, ja["state"], ja["threads"]))
    check([e[2].get("threads") for e in aevs if e[1] == "state" and e[2]["state"] == "running"]
          == [3], "the running event's threads")
    blob = s.request("GET", "/checkpoints/%s-3" % aid).body
    (n,) = struct.unpack("<Q", blob[:8])
    meta = json.loads(blob[8:8 + n])["__metadata__"]
    check(json.loads(meta["spec"])["train"]["threads"] == 3, "the checkpoint's spec: %s" % meta["spec"][:300])

    # no event names a server path (the data folder, the job's folder "out/...")
    for ev in evs:
        text = json.dumps(ev[2])
        check(s.data not in text and "out/" not in text and "DATA" not in text,
              "a server path in %s" % (ev,))

    # resuming: the header, the query, both (the header wins), either one bad
    mid = ids[len(ids) // 2]
    tail = [e for e in evs if e[0] > mid]
    got, _ = s.events(jid, last_event_id=mid)
    check(got == tail, "Last-Event-ID %d: %d events, not %d" % (mid, len(got), len(tail)))
    r = s.request("GET", "/jobs/%s/events?last_event_id=%d" % (jid, ids[-2]))
    check(r.status == 200 and r.body.count(b"\nevent: ") + r.body.startswith(b"event: ") == 1
          and ("id: %d\n" % ids[-1]).encode() in r.body, "last_event_id alone: %s" % r.body[:200])
    r = s.request("GET", "/jobs/%s/events?last_event_id=0" % jid,
                  headers={"Last-Event-ID": str(ids[-2])})
    check(r.status == 200 and ("id: %d\n" % ids[-1]).encode() in r.body and
          b"id: 1\n" not in r.body, "both: the header did not win: %s" % r.body[:200])
    problem_ok(s.request("GET", "/jobs/%s/events?last_event_id=x" % jid,
                         headers={"Last-Event-ID": "3"}), 400, "last_event_id")
    problem_ok(s.request("GET", "/jobs/%s/events?last_event_id=3" % jid,
                         headers={"Last-Event-ID": "-1"}), 400, "Last-Event-ID")
    problem_ok(s.request("GET", "/jobs/%s/events?last_event_id=1e3" % jid), 400, "last_event_id")
    s.stop()
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
