"""test_plan_worker.py - POST /train's admission planning off the HTTP threads (issue 23, item 2),
over real loopback sockets: a flood of heavy-but-valid specs (each plans for seconds and
hundreds of MB: 8 levels of 128 px, 8 layers per block, batch 1024, a 1 MB budget no plan fits)
never keeps /healthz from answering within a second, the ones past the planning queue are
answered 503 + Retry-After at once, and the server's memory returns to its idle size after;
with the planning held (DDPMD_TEST_HOLD_PLAN_FILE) on a server of one HTTP thread, the
requests waiting for their plans hold no thread (/healthz and the queue-full 503 answer at
once) and are answered once released; a plan that outlives --plan-timeout is a 503 at the
deadline. POST /samples plans on the same worker: held, its requests hold no HTTP thread either
and a flood past the queue is 503 planner-busy at once. A heavy search past --plan-timeout stops
there (the worker is free for the next request at once), and one past --plan-memory stops at
the cap with a 422. About 40 s.
Usage: test_plan_worker.py PATH/TO/ddpmd
"""
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, need_fmnist, problem_ok, tiny  # noqa: E402

LATENCY_MAX = 1.0   # the contract: /healthz answers within a second whatever POST /train does
FLOOD = 12          # heavy POST /train at once: more than the 4 HTTP threads
RSS_KEPT_MAX = 100  # MiB the server may keep after planning (one heavy plan peaks at ~260 MiB)


def heavy():
    t = tiny(batch=1024)
    t["model"].update(image_size=128, block_out_channels=[32, 32, 64, 64, 64, 64, 64, 64],
                      layers_per_block=8, attention_resolutions=[16], norm_num_groups=8)
    t["data"]["fmnist_resize"] = "resize"
    t["memory"] = {"vram_budget": 1 << 20}  # no plan fits: searched to the end, then 422
    return t


def post_async(s, spec, out, i, timeout=120):
    def run():
        t0 = time.monotonic()
        try:
            r = s.request("POST", "/train", spec, timeout=timeout)
            out[i] = (r.status, r, time.monotonic() - t0)
        except OSError as e:
            out[i] = (0, e, time.monotonic() - t0)
    th = threading.Thread(target=run)
    th.start()
    return th


def vm(pid, key):
    """the server's VmRSS / VmHWM in MiB"""
    for line in open("/proc/%d/status" % pid):
        k, _, v = line.partition(":")
        if k == key:
            return int(v.split()[0]) // 1024
    return -1


def probe_healthz(s, stop, lat):
    while not stop.is_set():
        t0 = time.monotonic()
        r = s.request("GET", "/healthz", timeout=30)
        lat.append((r.status, time.monotonic() - t0))
        time.sleep(0.05)


def phase_flood(exe):
    # the default threads and queue; a deadline no loaded machine reaches, so every request
    # that got a slot is planned to its end (the deadline itself: phase_timeout)
    s = Server(exe, args=["--plan-timeout", "300"]).start()
    idle = vm(s.proc.pid, "VmRSS")
    stop, lat = threading.Event(), []
    prober = threading.Thread(target=probe_healthz, args=(s, stop, lat))
    prober.start()
    time.sleep(0.2)
    out = [None] * FLOOD
    ths = [post_async(s, heavy(), out, i) for i in range(FLOOD)]
    for th in ths:
        th.join(120)
    stop.set()
    prober.join(30)
    statuses = sorted(o[0] for o in out)
    busy = [o for o in out if o[0] == 503]
    for o in busy:
        p = problem_ok(o[1], 503)
        check(p["type"] == "urn:ddpmd:problem:planner-busy", "503 type %s" % p["type"])
        check(o[1].header("Retry-After"), "a 503 without Retry-After")
        check(o[2] < LATENCY_MAX, "a planner-busy 503 took %.2f s" % o[2])
    planned = [o for o in out if o[0] == 422]
    for o in planned:
        check(o[1].json()["type"] == "urn:ddpmd:problem:never-fits", "422 %s" % o[1].body[:200])
    worst = max(d for _, d in lat)
    check(all(st == 200 for st, _ in lat), "healthz statuses %s" % set(st for st, _ in lat))
    check(worst < LATENCY_MAX, "/healthz took %.2f s during the flood (limit %.1f s)"
          % (worst, LATENCY_MAX))
    check(len(planned) + len(busy) == FLOOD, "answers %s" % statuses)
    check(busy and planned, "a flood of %d: %d planned, %d refused busy (both expected)"
          % (FLOOD, len(planned), len(busy)))
    # what the plans held is given back (malloc_trim after each): the server's resident memory
    # returns near where it was, whatever its peak (not under ASan: its allocator keeps freed
    # memory in quarantine and never trims)
    with open(exe, "rb") as f:
        asan = b"__asan_init" in f.read()
    deadline, rss = time.monotonic() + (0 if asan else 20), idle
    while time.monotonic() < deadline:
        rss = vm(s.proc.pid, "VmRSS")
        if rss <= idle + RSS_KEPT_MAX:
            break
        time.sleep(0.2)
    peak = vm(s.proc.pid, "VmHWM")
    check(asan or rss <= idle + RSS_KEPT_MAX, "the server kept %d MiB after the plans (%d MiB "
          "idle, peak %d MiB)" % (rss, idle, peak))
    print("memory: %d MiB idle, peak %d MiB, %s" % (idle, peak, "not checked after (ASan)" if asan
          else "%d MiB after the plans" % rss), flush=True)
    slowest = max(o[2] for o in planned)
    print("flood: %d heavy POST /train: %d planned (422 never-fits, slowest answered after "
          "%.2f s), %d refused 503 planner-busy; %d /healthz probes, max %.3f s"
          % (FLOOD, len(planned), slowest, len(busy), len(lat), worst), flush=True)
    check(s.stop() == 0, "the server's exit status")


def phase_held(exe):
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    release = os.path.join(d, "release-plans")
    # one HTTP thread: a request waiting for its plan must not hold it (it is suspended)
    s = Server(exe, data=d, args=["--plan-workers", "1", "--plan-queue", "1",
                                  "--http-threads", "1"],
               env={"DDPMD_TEST_HOLD_PLAN_FILE": release})
    s.own_data = True
    s.start()
    # POSTs one after another until one is refused: each one before it waits for its held plan
    # (the worker's and the queue's slot), so exactly --plan-workers + --plan-queue are held
    # whatever the machine's speed
    out, ths, r, took = [], [], None, None
    for i in range(6):
        out.append(None)
        ths.append(post_async(s, tiny(steps=1), out, i))
        t0 = time.monotonic()
        while out[i] is None and time.monotonic() - t0 < 1.5:
            time.sleep(0.01)
        if out[i] is not None:
            r, took = out[i][1], out[i][2]
            out.pop()
            ths.pop().join()
            break
    check(r is not None, "six POST /train held: the planning queue has no bound")
    p = problem_ok(r, 503)
    check(p["type"] == "urn:ddpmd:problem:planner-busy" and r.header("Retry-After"),
          "queue full: %s, Retry-After %s" % (p, r.header("Retry-After")))
    check(took < LATENCY_MAX, "the queue-full 503 took %.2f s" % took)
    check(len(out) == 2 and out == [None, None], "held %d requests (--plan-workers 1, "
          "--plan-queue 1): %s" % (len(out), out))
    t0 = time.monotonic()
    check(s.get_json("/healthz").get("status") == "ok", "healthz")
    hz = time.monotonic() - t0
    check(hz < LATENCY_MAX, "/healthz took %.2f s while the planning is held" % hz)
    open(release, "w").close()
    for th in ths:
        th.join(60)
    check([o[0] for o in out] == [202, 202], "the held requests: %s" % [o[0] for o in out])
    print("held: queue full answered 503 planner-busy in %.3f s, /healthz in %.3f s; the two "
          "held requests 202 once released" % (took, hz), flush=True)
    check(s.stop() == 0, "the held server's exit status")


def phase_samples(exe):
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    release = os.path.join(d, "release-plans")
    open(release, "w").close()  # not held while the checkpoint is trained
    s = Server(exe, data=d, args=["--plan-workers", "1", "--plan-queue", "1",
                                  "--http-threads", "1"],
               env={"DDPMD_TEST_HOLD_PLAN_FILE": release})
    s.own_data = True
    s.start()
    r = s.request("POST", "/train", tiny(steps=1, checkpoint_every=1))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="the training job succeeding")
    os.unlink(release)
    # a flood of sampling requests at once on one HTTP thread, their planning held: two wait
    # (the worker's slot and the queue's), every other one is refused at once, and /healthz
    # answers meanwhile; planned on the HTTP thread instead, the first would hold the thread
    req = {"job": jid, "n": 1024, "batch": 1024, "steps": 1}
    n = 8
    out = [None] * n
    ths = []
    for i in range(n):
        ths.append(threading.Thread(target=lambda i=i: out.__setitem__(i, timed(s, req))))
        ths[-1].start()
        time.sleep(0.05)
    t0 = time.monotonic()
    while sum(o is not None for o in out) < n - 2 and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    t0 = time.monotonic()
    check(s.get_json("/healthz").get("status") == "ok", "healthz")
    hz = time.monotonic() - t0
    done = [o for o in out if o is not None]
    check(len(done) == n - 2, "%d of %d POST /samples answered while 2 plans are held: %s"
          % (len(done), n, [o and o[0] for o in out]))
    for st, r, took in done:
        p = problem_ok(r, 503)
        check(p["type"] == "urn:ddpmd:problem:planner-busy" and r.header("Retry-After"),
              "queue full: %s" % p)
        check(took < LATENCY_MAX, "a planner-busy 503 took %.2f s" % took)
    check(hz < LATENCY_MAX, "/healthz took %.2f s while the sample plans are held" % hz)
    open(release, "w").close()
    for th in ths:
        th.join(60)
    held = [o for o in out if o not in done]
    check([o[0] for o in held] == [202, 202], "the held samples: %s"
          % [(o[0], o[1].body[:200]) for o in held])
    for _, r, _ in held:
        s.request("POST", "/jobs/%s/cancel" % r.json()["id"])
    print("samples: %d POST /samples at once, planning held: 2 held, %d answered 503 "
          "planner-busy (slowest %.3f s), /healthz in %.3f s; the held two 202 once released"
          % (n, len(done), max(o[2] for o in done), hz), flush=True)
    check(s.stop() == 0, "the samples server's exit status")


def timed(s, req):
    t0 = time.monotonic()
    r = s.request("POST", "/samples", req, timeout=60)
    return (r.status, r, time.monotonic() - t0)


def phase_cancel(exe):
    # a search of seconds (4096 micro-batch sizes' graphs) past a 1 s deadline stops there:
    # the next request is planned at once (were the search to run on, that one would wait
    # past its own deadline behind it and be a 503 too)
    s = Server(exe, args=["--plan-timeout", "1", "--plan-memory", "4GiB"]).start()
    big = heavy()
    big["train"]["batch"] = 4096
    t0 = time.monotonic()
    r = s.request("POST", "/train", big, timeout=120)
    took = time.monotonic() - t0
    p = problem_ok(r, 503)
    check(p["type"] == "urn:ddpmd:problem:plan-timeout", "heavy: %s" % p)
    t0 = time.monotonic()
    r = s.request("POST", "/train", tiny(steps=1), timeout=120)
    light = time.monotonic() - t0
    check(r.status == 202, "the light plan after a timed-out heavy one: %d %s (%.2f s): the "
          "worker still searched the heavy one" % (r.status, r.body[:200], light))
    s.wait_job(r.json()["id"], lambda j: j["state"] == "succeeded", what="the light job")
    print("cancel: heavy search 503 plan-timeout after %.2f s (--plan-timeout 1), the next "
          "plan answered 202 %.3f s later" % (took, light), flush=True)
    check(s.stop() == 0, "the cancel server's exit status")


def phase_memory(exe):
    # one planning's memory capped: the heavy search (~270 MB of graphs) stops at 64 MiB
    s = Server(exe, args=["--plan-memory", "64MiB"]).start()
    idle = vm(s.proc.pid, "VmRSS")
    t0 = time.monotonic()
    r = s.request("POST", "/train", heavy(), timeout=120)
    took = time.monotonic() - t0
    p = problem_ok(r, 422, "model")
    msg = p["errors"][0]["message"]
    check("--plan-memory" in msg, "the 422's message: %s" % msg)
    peak = vm(s.proc.pid, "VmHWM")
    print("memory: the heavy search refused 422 at --plan-memory 64MiB after %.2f s; server "
          "peak %d MiB (%d idle)" % (took, peak, idle), flush=True)
    check(s.stop() == 0, "the memory server's exit status")


def phase_threads(exe):
    # a spec that names no train.threads gets the free cores when it starts: its step time is
    # predicted at every core (--cpu-cores), as a spec naming that many (budgets no plan fits:
    # answered with the plans, nothing runs)
    s = Server(exe, args=["--cpu-cores", "4"]).start()
    pred = []
    for threads in (4, None):
        t = tiny()
        t["memory"] = {"vram_budget": 1 << 20}
        if threads is None:
            del t["train"]["threads"]
        else:
            t["train"]["threads"] = threads
        p = problem_ok(s.request("POST", "/train", t), 422)
        pred.append(p["plan"]["predicted_step_seconds"])
    check(abs(pred[1] - pred[0]) <= 1e-9 * pred[0], "predicted step seconds: %g at 4 threads, "
          "%g with none named on 4 cores" % tuple(pred))
    print("threads: none named on 4 cores predicted as 4 threads (%.4g s/step)" % pred[1],
          flush=True)
    check(s.stop() == 0, "the threads server's exit status")


def phase_timeout(exe):
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    release = os.path.join(d, "release-plans")
    s = Server(exe, data=d, args=["--plan-timeout", "1"],
               env={"DDPMD_TEST_HOLD_PLAN_FILE": release})
    s.own_data = True
    s.start()
    t0 = time.monotonic()
    r = s.request("POST", "/train", tiny(steps=1))
    took = time.monotonic() - t0
    p = problem_ok(r, 503)
    check(p["type"] == "urn:ddpmd:problem:plan-timeout" and r.header("Retry-After"),
          "timeout: %s" % p)
    check(took >= 0.9, "answered before the deadline: %.2f s" % took)
    check(s.get_json("/jobs")["jobs"] == [], "a timed-out request stored a job")
    open(release, "w").close()
    print("timeout: 503 plan-timeout after %.2f s (--plan-timeout 1)" % took, flush=True)
    check(s.stop() == 0, "the timed-out server's exit status")


def main(exe):
    need_fmnist()
    phase_held(exe)
    phase_samples(exe)
    phase_timeout(exe)
    phase_cancel(exe)
    phase_memory(exe)
    phase_threads(exe)
    phase_flood(exe)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
