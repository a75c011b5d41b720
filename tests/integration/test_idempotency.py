"""test_idempotency.py - Idempotency-Key on POST /train and POST /samples (the first answer again
for the same owner, key and body, also after a restart; 422 for the key with another body or
route; another owner's key is its own; a refused request leaves the key free) and the per-owner
limit of queued + running jobs (--max-jobs-per-owner: 429 with Retry-After, nothing stored); a
key whose job was made but whose answer was lost gets that job again, never a second one.
Usage: test_idempotency.py PATH/TO/ddpmd
"""
import os
import sqlite3
import sys
import tempfile
import time

from serverlib import Server, check, need_fmnist, problem_ok, tiny, validate

ALICE = "alice-secret-0123456789"
BOB = "bob-secret-0123456789ab"


def jobs_of(s, token):
    return [j["id"] for j in s.get_json("/jobs", token=token)["jobs"]]


def wait_end(s, token, jid, want=None, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = s.get_json("/jobs/" + jid, token=token)
        if j["state"] in ("succeeded", "failed", "canceled"):
            check(want is None or j["state"] == want, "job %s ended %s" % (jid, j["state"]))
            return j
        time.sleep(0.1)
    check(False, "job %s did not end" % jid)


def cancel_all(s, token):
    for jid in jobs_of(s, token):
        j = s.get_json("/jobs/" + jid, token=token)
        if j["state"] in ("queued", "running"):
            s.request("POST", "/jobs/%s/cancel" % jid, token=token)
    for jid in jobs_of(s, token):
        wait_end(s, token, jid)


def main(exe):
    need_fmnist()
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    tokfile = os.path.join(d, "tokens")
    with open(tokfile, "w") as f:
        f.write("alice %s\nbob %s\n" % (ALICE, BOB))
    os.chmod(tokfile, 0o600)  # a token file must be private (api_tokens_load)
    args = ["--token-file", tokfile, "--max-jobs-per-owner", "2"]
    s = Server(exe, data=d, args=args)
    s.own_data = True
    s.start()
    long_job = tiny(steps=100000, checkpoint_every=100000)
    # a finished job (ended jobs do not count against the limit) to sample from
    r = s.request("POST", "/train", tiny(), token=ALICE)
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    done = r.json()["id"]
    wait_end(s, ALICE, done, "succeeded")

    k1 = {"Idempotency-Key": "order-1"}
    r = s.request("POST", "/train", long_job, headers=k1, token=ALICE)
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    first = r.body
    a = r.json()["id"]
    r2 = s.request("POST", "/train", long_job, headers=k1, token=ALICE)
    check(r2.status == 202 and r2.body == first and r2.header("Location") == "/jobs/" + a,
          "the replay differs: %d %s" % (r2.status, r2.body[:300]))
    check(r2.header("Idempotent-Replayed") == "true", "no Idempotent-Replayed header")
    check(jobs_of(s, ALICE) == [done, a], "a replay stored a job: %s" % jobs_of(s, ALICE))
    problem_ok(s.request("POST", "/train", tiny(steps=7), headers=k1, token=ALICE), 422,
               "Idempotency-Key")
    problem_ok(s.request("POST", "/samples", {"job": a}, headers=k1, token=ALICE), 422,
               "Idempotency-Key")
    problem_ok(s.request("POST", "/train", long_job, headers={"Idempotency-Key": "a b"},
                         token=ALICE), 400, "Idempotency-Key")
    # another owner's key is its own
    r = s.request("POST", "/train", long_job, headers=k1, token=BOB)
    check(r.status == 202 and r.json()["id"] != a, "bob's key: %d %s" % (r.status, r.body[:200]))
    # a refused request is not remembered: the key still works with a good body
    k2 = {"Idempotency-Key": "order-2"}
    problem_ok(s.request("POST", "/train", tiny(steps=-1), headers=k2, token=ALICE), 422)
    r = s.request("POST", "/train", long_job, headers=k2, token=ALICE)
    check(r.status == 202, "the key after a refusal: %d %s" % (r.status, r.body[:300]))

    # alice has 2 queued or running: the limit
    for path, body in (("/train", long_job), ("/samples", {"job": done, "n": 1, "steps": 1})):
        p = problem_ok(s.request("POST", path, body, headers={"Idempotency-Key": "order-3"},
                                 token=ALICE), 429)
        check(p["type"].endswith("owner-limit") and "--max-jobs-per-owner" in p["detail"],
              "429 body %s" % p)
    r = s.request("POST", "/train", long_job, token=ALICE)
    check(r.status == 429 and r.header("Retry-After"), "no Retry-After on 429")
    check(len(jobs_of(s, ALICE)) == 3, "a refused job was stored")
    cancel_all(s, ALICE)
    r = s.request("POST", "/train", long_job, headers={"Idempotency-Key": "order-3"}, token=ALICE)
    check(r.status == 202, "after the cancels: %d %s" % (r.status, r.body[:300]))
    cancel_all(s, ALICE)
    cancel_all(s, BOB)

    # the answers live in the store: a restart replays them
    check(s.stop() == 0, "server exit")
    s2 = Server(exe, data=d, args=args)
    s2.start()
    r = s2.request("POST", "/train", long_job, headers=k1, token=ALICE)
    check(r.status == 202 and r.body == first, "after a restart: %d %s" % (r.status, r.body[:300]))
    check(len(jobs_of(s2, ALICE)) == 4, "the replay after a restart stored a job")
    validate(r.json(), "Job")

    # a key whose job was made but whose answer was not stored (the state a failed save, or a
    # server that died between the job and its answer, leaves): the retry gets that job, not a
    # second one, also after a restart
    k4 = {"Idempotency-Key": "order-4"}
    r = s2.request("POST", "/train", long_job, headers=k4, token=ALICE)
    check(r.status == 202, "POST /train order-4: %d %s" % (r.status, r.body[:300]))
    made = r.json()["id"]
    cancel_all(s2, ALICE)
    check(s2.stop() == 0, "server exit")
    db = sqlite3.connect(os.path.join(d, "ddpmd.db"))
    n = db.execute("UPDATE idempotency SET status = 0, location = NULL, response = NULL "
                   "WHERE owner = 'alice' AND key = 'order-4'").rowcount
    db.commit()
    db.close()
    check(n == 1, "no stored answer of order-4 to drop")
    s3 = Server(exe, data=d, args=args)
    s3.start()
    count = len(jobs_of(s3, ALICE))
    r = s3.request("POST", "/train", long_job, headers=k4, token=ALICE)
    check(r.status == 202 and r.json()["id"] == made and r.header("Location") == "/jobs/" + made
          and r.header("Idempotent-Replayed") == "true",
          "the retry of a key whose answer was lost: %d %s" % (r.status, r.body[:300]))
    validate(r.json(), "Job")
    check(len(jobs_of(s3, ALICE)) == count, "the retry made a second job")
    r2 = s3.request("POST", "/train", long_job, headers=k4, token=ALICE)
    check(r2.status == 202 and r2.body == r.body, "the answer is stored now: %s" % r2.body[:200])
    check(s3.stop() == 0, "server exit")
    print("test_idempotency: ok")


if __name__ == "__main__":
    main(sys.argv[1])
