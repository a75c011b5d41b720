"""test_concurrency.py - submits and cancels from several clients at once against a cpu budget
that holds two jobs: the sum of reservations never exceeds the budget (nor do more than two jobs
run), no admitted job fails, every job ends canceled, and nothing stays reserved. Then 24 event
streams at once on 2 HTTP threads (a stream holds no thread). Usage: test_concurrency.py
PATH/TO/ddpmd
"""
import random
import sys
import threading
import time

from serverlib import Server, check, need_fmnist, problem_ok, tiny

CLIENTS, JOBS_EACH = 4, 3


def main(exe):
    need_fmnist()
    probe = Server(exe, args=["--vram-budget", "cpu=1MiB"]).start()
    need = problem_ok(probe.request("POST", "/train", tiny()), 422)["needed_bytes"]
    probe.stop()

    budget = need * 5 // 2
    s = Server(exe, args=["--vram-budget", "cpu=%d" % budget, "--max-queue", "100"]).start()
    long = tiny(steps=100000, checkpoint_every=0)
    errors, ids, lock = [], [], threading.Lock()
    stop = threading.Event()

    def monitor():
        while not stop.is_set():
            d = s.get_json("/readyz")["devices"][0]
            if d["reserved_bytes"] > d["budget_bytes"] or d["running_jobs"] > 2:
                errors.append("over budget: %s" % d)
            running = s.get_json("/jobs?state=running")["jobs"]
            if sum(j["reserved_bytes"] for j in running) > budget:
                errors.append("running jobs reserve more than the budget: %s" % [j["id"] for j in running])
            time.sleep(0.02)

    def client(seed):
        rnd = random.Random(seed)
        mine = []
        for _ in range(JOBS_EACH):
            r = s.request("POST", "/train", long)
            if r.status != 202:
                errors.append("submit: %d %s" % (r.status, r.body[:200]))
                continue
            mine.append(r.json()["id"])
            time.sleep(rnd.random() * 0.5)
            if rnd.random() < 0.5:
                victim = mine.pop(rnd.randrange(len(mine)))
                r = s.request("POST", "/jobs/%s/cancel" % victim)
                if r.status not in (200, 202):
                    errors.append("cancel: %d %s" % (r.status, r.body[:200]))
                with lock:
                    ids.append(victim)
        with lock:
            ids.extend(mine)

    mon = threading.Thread(target=monitor)
    mon.start()
    clients = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    time.sleep(1)  # the pool starts what fits meanwhile
    for j in ids:
        r = s.request("POST", "/jobs/%s/cancel" % j)
        if r.status not in (200, 202, 409):
            errors.append("final cancel: %d" % r.status)
    for j in ids:
        s.wait_job(j, lambda x: x["state"] == "canceled", timeout=120, what="canceled")
    stop.set()
    mon.join()
    check(not errors, "; ".join(errors[:5]))
    check(len(ids) == CLIENTS * JOBS_EACH, "jobs %d" % len(ids))
    all_jobs = s.get_json("/jobs?limit=200")["jobs"]
    check(all(j["state"] == "canceled" and j["error"] is None for j in all_jobs),
          "states %s" % sorted(set((j["state"], j["error"]) for j in all_jobs)))
    d = s.get_json("/readyz")["devices"][0]
    check(d["reserved_bytes"] == 0 and d["running_jobs"] == 0, "left reserved: %s" % d)
    check(s.stop() == 0, "exit status")

    # event streams hold no thread: 24 streams open at once on a server with 2 HTTP threads all
    # follow the job to its end, and plain requests are answered meanwhile
    s2 = Server(exe, args=["--http-threads", "2"]).start()
    jid = s2.request("POST", "/train", tiny(steps=6)).json()["id"]
    results = []

    def follow():
        evs, _ = s2.events(jid, timeout=120)
        results.append(evs)

    followers = [threading.Thread(target=follow) for _ in range(24)]
    for t in followers:
        t.start()
    time.sleep(0.5)
    check(s2.get_json("/healthz")["status"] == "ok", "healthz with 24 open streams")
    check(s2.get_json("/jobs/" + jid)["id"] == jid, "GET /jobs/{id} with 24 open streams")
    for t in followers:
        t.join()
    check(len(results) == 24, "streams ended: %d" % len(results))
    check(all(r == results[0] and r[-1][2]["state"] == "succeeded" for r in results),
          "the streams differ or did not end with succeeded")
    check(s2.stop() == 0, "exit status")
    print("test_concurrency: ok (%d jobs, 24 streams)" % len(ids))


if __name__ == "__main__":
    main(sys.argv[1])
