"""test_restart.py - nothing lost across restarts: SIGTERM during training stops the job's
process with a checkpoint and the server exits 0; the next start re-queues the job and resumes it
from that checkpoint (not from step 0). kill -9 of the server takes its job process with it
(PR_SET_PDEATHSIG), and the next start resumes again; the job then finishes. A cancel cut short
by kill -9 ends canceled at the next start. Usage:
test_restart.py PATH/TO/ddpmd
"""
import signal
import sys
import time

from serverlib import Server, check, job_processes, need_fmnist, tiny


def step_events(evs):
    return [e[2]["step"] for e in evs if e[1] == "progress" and e[2].get("event") == "step"]


# long enough to be still running when the second server is killed: the quiet job's start-up
# (two job processes, its memory plan) takes a while on a loaded machine, and at 24 steps the job
# had sometimes finished by then (starts 2, not 3)
STEPS = 64


def main(exe):
    need_fmnist()
    s = Server(exe).start()
    spec = tiny(steps=STEPS, checkpoint_every=4)
    jid = s.request("POST", "/train", spec).json()["id"]
    s.wait_job(jid, lambda j: j["step"] >= 5, what="step 5")
    check(s.stop(signal.SIGTERM) == 0, "SIGTERM: exit status")
    check(job_processes(s.data) == [], "a job process outlived the server")

    # restart on the same data: running -> queued -> resumed from the stop's checkpoint
    s2 = Server(exe, data=s.data).start()
    s2.own_data = False
    seen = {"running": 0}

    def first_step_of_second_run(e):
        if e[1] == "state" and e[2]["state"] == "running":
            seen["running"] += 1
        return seen["running"] == 2 and e[1] == "progress" and e[2].get("event") == "step"

    evs, _ = s2.events(jid, until=first_step_of_second_run)
    states = [e[2] for e in evs if e[1] == "state"]
    check([x["state"] for x in states] == ["queued", "running", "queued", "running"],
          "states across the restart %s" % states)
    r0 = states[3].get("resumed_from_step", 0)
    check(r0 >= 5, "resumed from step %d (the stop was after step 5)" % r0)
    check(step_events(evs)[-1] == r0 + 1, "the first step after the restart is %d, resumed at %d"
          % (step_events(evs)[-1], r0))

    # kill -9 while it runs: its job processes die with it. One of them writes nothing (no
    # progress lines), so only PR_SET_PDEATHSIG can end it, not a broken pipe
    quiet = s2.request("POST", "/train", tiny(steps=100000, checkpoint_every=0, log_every=100000))
    check(quiet.status == 202, "quiet job: %d %s" % (quiet.status, quiet.body[:200]))
    qid = quiet.json()["id"]
    s2.wait_job(qid, lambda j: j["state"] == "running", what="quiet job running")
    deadline = time.time() + 30
    while len(job_processes(s2.data)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    check(len(job_processes(s2.data)) == 2, "job processes %s" % job_processes(s2.data))
    # past its start-up output (the memory plan on stderr ends with the device total)
    s2.events(qid, until=lambda e: e[1] == "log" and
              e[2]["line"].lstrip().startswith("device total"))
    time.sleep(0.5)
    j = s2.get_json("/jobs/" + jid)
    check(j["state"] == "running", "the first job is still running before the kill: %s at step "
          "%s of %s" % (j["state"], j["step"], STEPS))
    s3data = s2.data
    s2.proc.send_signal(signal.SIGKILL)
    s2.proc.wait()
    deadline = time.time() + 5
    while job_processes(s3data) and time.time() < deadline:
        time.sleep(0.1)
    check(job_processes(s3data) == [], "a job process outlived kill -9 of the server")

    s3 = Server(exe, data=s3data).start()
    check(s3.request("POST", "/jobs/%s/cancel" % qid).status in (200, 202), "cancel the quiet job")
    evs, _ = s3.events(jid)
    j = s3.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded" and j["step"] == STEPS, "final job %s" % j)
    check(j["starts"] == 3, "starts %d" % j["starts"])
    running = [e[2] for e in evs if e[1] == "state" and e[2]["state"] == "running"]
    check(len(running) == 3, "running states %s" % running)
    s3.wait_job(qid, lambda j: j["state"] == "canceled", what="quiet job canceled")

    # a cancel the server had no time to finish (kill -9 right after it) ends canceled at the
    # next start, not resumed
    cid = s3.request("POST", "/train", tiny(steps=100000, checkpoint_every=0)).json()["id"]
    s3.wait_job(cid, lambda j: j["step"] >= 1, what="a first step")
    check(s3.request("POST", "/jobs/%s/cancel" % cid).status == 202, "cancel")
    s3.proc.send_signal(signal.SIGKILL)
    s3.proc.wait()
    s4 = Server(exe, data=s3data).start()
    j = s4.get_json("/jobs/" + cid)
    check(j["state"] == "canceled" and j["error"] is None, "after the restart: %s %s" % (j["state"], j["error"]))
    check(s4.get_json("/jobs/" + jid)["state"] == "succeeded", "the finished job stays finished")
    check(s4.stop() == 0, "exit status")
    print("test_restart: ok")


if __name__ == "__main__":
    main(sys.argv[1])
