"""test_retries.py - bounded retries: a job whose process dies of a signal (here SIGKILL from the
test, the deterministic crash that needs no test-only code in the binary) is started again from
its last checkpoint up to --max-retries times, then fails with the reason; nothing stays reserved.
Usage: test_retries.py PATH/TO/ddpmd
"""
import os
import signal
import sys
import time

from serverlib import Server, check, job_processes, need_fmnist


def kill_child(s, jid, starts):
    j = s.wait_job(jid, lambda j: j["state"] == "running" and j["starts"] == starts and
                   j["step"] >= 3, what="running (start %d) past step 3" % starts)
    deadline = time.time() + 30
    while time.time() < deadline:
        pids = job_processes(s.data)
        if pids:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            return j
        time.sleep(0.05)
    check(False, "no job process to kill")


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--max-retries", "2"]).start()
    from serverlib import tiny
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=2))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    for start in (1, 2, 3):
        kill_child(s, jid, start)
    end = s.wait_job(jid, lambda j: j["state"] == "failed", what="failed after its retries")
    check("killed by signal 9" in end["error"] and "--max-retries" in end["error"],
          "error %r" % end["error"])
    check(end["starts"] == 3, "starts %d (1 + 2 retries)" % end["starts"])
    evs, _ = s.events(jid)
    states = [e[2]["state"] for e in evs if e[1] == "state"]
    check(states == ["queued", "running", "queued", "running", "queued", "running", "failed"],
          "states %s" % states)
    retries = [e[2] for e in evs if e[1] == "retry"]
    check([x["attempt"] for x in retries] == [1, 2] and all(x["signal"] == 9 for x in retries),
          "retry events %s" % retries)
    resumed = [e[2].get("resumed_from_step") for e in evs if e[1] == "state" and
               e[2]["state"] == "running"]
    check(resumed[0] is None and all(x and x >= 2 for x in resumed[1:]),
          "the retries did not resume from a checkpoint: %s" % resumed)
    d = s.get_json("/devices")["devices"][0]
    check(d["reserved_bytes"] == 0 and d["running_jobs"] == 0, "still reserved: %s" % d)
    print("test_retries: ok")


if __name__ == "__main__":
    main(sys.argv[1])
