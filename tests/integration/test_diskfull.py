"""test_diskfull.py - a real `ddpmd serve` whose --data is a small tmpfs that fills up (issue 9):
(a) with the disk full POST /train answers 507 problem+json with the cause (the job's files, or
SQLITE_FULL from the store with an Idempotency-Key), stores nothing, the server stays healthy and
takes the job once space is freed; (b) a running job whose next checkpoint hits ENOSPC ends failed
with that cause, its previous checkpoint intact and listed; (c) with the disk filled to the last byte while a job
runs, the job's end is still recorded (the store's reserve) and new jobs get 507. Skips (77) where tmpfs cannot be
mounted; the tmpfs is unmounted whatever happens. Usage: test_diskfull.py PATH/TO/ddpmd
"""
import os
import subprocess
import sys
import tempfile

from serverlib import Server, check, need_fmnist, problem_ok, tiny, validate


def fill(path, leave=0):
    """writes path until the file system has `leave` bytes free (0: not one byte more)"""
    with open(path, "wb", buffering=0) as f:
        while True:
            st = os.statvfs(os.path.dirname(path))
            free = st.f_bavail * st.f_frsize
            want = free - leave
            if want <= 0:
                return
            try:
                f.write(b"\0" * min(want, 1 << 20))
            except OSError:
                if leave:
                    raise
                break
        # the last partial page, byte by byte
        for _ in range(8192):
            try:
                f.write(b"\0")
            except OSError:
                return


def jobs_on_disk(data):
    d = os.path.join(data, "jobs")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def part_a(s):
    filler = os.path.join(s.data, "fill")
    fill(filler)
    before = jobs_on_disk(s.data)
    # the job's folder and spec.json cannot be written
    p = problem_ok(s.request("POST", "/train", tiny()), 507)
    check("No space left on device" in p["detail"], "507 names ENOSPC: %s" % p)
    check(s.data not in p["detail"], "a server path in the problem: %s" % p)
    check(p["type"].endswith("insufficient-storage"), "problem type %s" % p["type"])
    # with an Idempotency-Key the store's reservation is the first write: SQLite's SQLITE_FULL
    p = problem_ok(s.request("POST", "/train", tiny(), headers={"Idempotency-Key": "k-full"}), 507)
    check("SQLITE_FULL" in p["detail"], "507 names SQLITE_FULL: %s" % p)
    check(s.get_json("/jobs")["jobs"] == [], "no job stored while the disk was full")
    check(jobs_on_disk(s.data) == before, "no job folder left: %s" % jobs_on_disk(s.data))
    check(s.get_json("/healthz")["status"] == "ok", "healthz while full")
    os.unlink(filler)
    r = s.request("POST", "/train", tiny(steps=2, checkpoint_every=0),
                  headers={"Idempotency-Key": "k-full"})
    check(r.status == 202, "POST after freeing space: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="the job after freeing succeeded")


def part_b(s):
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=4, keep_last=3))
    check(r.status == 202, "POST /train (long): %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s.wait_job(jid, lambda j: j["step"] >= 5, timeout=120, what="a first checkpoint and a step")
    cl = s.get_json("/jobs/%s/checkpoints" % jid)["checkpoints"]
    check(cl and cl[0]["step"] == 4, "the first checkpoint is listed: %s" % cl)
    first = cl[0]
    blob = s.request("GET", first["url"]).body
    check(len(blob) == first["bytes"] and len(blob) > (1 << 20), "checkpoint %d bytes" % len(blob))
    # room for the store's writes (events, the failure), never for a checkpoint
    filler = os.path.join(s.data, "fill")
    fill(filler, leave=first["bytes"] // 2)
    j = s.wait_job(jid, lambda j: j["state"] == "failed", timeout=120, what="failed on ENOSPC")
    os.unlink(filler)
    validate(j, "Job")
    check(j["error"] and "No space left on device" in j["error"], "error names ENOSPC: %s" % j["error"])
    cl = s.get_json("/jobs/%s/checkpoints" % jid)["checkpoints"]
    steps = [c["step"] for c in cl]
    check(steps and steps[0] == 4 and all(st < j["step"] + 1 for st in steps),
          "the earlier checkpoints are listed: %s" % steps)
    r = s.request("GET", first["url"])
    check(r.status == 200 and r.body == blob, "the first checkpoint is intact")
    ck = os.path.join(s.data, "jobs", jid, "out", "checkpoints")
    left = [n for n in os.listdir(ck) if not n.endswith(".safetensors")]
    check(left == [], "no partial file beside the checkpoints: %s" % left)
    check(s.get_json("/healthz")["status"] == "ok", "healthz after the failure")
    r = s.request("POST", "/train", tiny(steps=2, checkpoint_every=0))
    check(r.status == 202, "POST after the failure: %d %s" % (r.status, r.body[:300]))
    s.wait_job(r.json()["id"], lambda j: j["state"] == "succeeded", what="a later job succeeded")


def part_c(s):
    """the disk filled to the last byte while a job runs: its end is still recorded (the store's
    reserve), and new jobs are refused 507 until space is freed"""
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=4, keep_last=1))
    check(r.status == 202, "POST /train (long): %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s.wait_job(jid, lambda j: j["step"] >= 5, timeout=120, what="a first checkpoint and a step")
    filler = os.path.join(s.data, "fill")
    fill(filler)
    j = s.wait_job(jid, lambda j: j["state"] == "failed", timeout=120, what="failed on a full disk")
    check(j["error"] and "No space left on device" in j["error"], "error names ENOSPC: %s" % j["error"])
    fill(filler + "2")  # what the reserve gave back is taken too
    problem_ok(s.request("POST", "/train", tiny()), 507)
    check(s.get_json("/healthz")["status"] == "ok", "healthz while full")
    os.unlink(filler)
    os.unlink(filler + "2")
    r = s.request("POST", "/train", tiny(steps=2, checkpoint_every=0))
    check(r.status == 202, "POST after freeing: %d %s" % (r.status, r.body[:300]))
    s.wait_job(r.json()["id"], lambda j: j["state"] == "succeeded", what="a later job succeeded")


def main(exe):
    need_fmnist()
    mnt = tempfile.mkdtemp(prefix="ddpmd-diskfull-")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m,mode=0755", "tmpfs", mnt],
                       capture_output=True)
    if p.returncode != 0:
        print("SKIP: cannot mount a tmpfs on %s: %s" % (mnt, p.stderr.decode().strip()))
        os.rmdir(mnt)
        sys.exit(77)
    s = None
    try:
        for part in (part_a, part_b, part_c):
            data = os.path.join(mnt, part.__name__)
            os.mkdir(data)
            s = Server(exe, data=data).start()
            try:
                part(s)
                check(s.stop() == 0, "the server's exit status")
            except BaseException:
                sys.stdout.write("server.log:\n" + s.log()[-4000:])
                raise
            finally:
                if s.proc and s.proc.poll() is None:
                    s.proc.kill()
                    s.proc.wait()
    finally:
        if subprocess.run(["umount", mnt]).returncode != 0:
            subprocess.run(["umount", "-l", mnt])
        os.rmdir(mnt)
    print("test_diskfull: ok")


if __name__ == "__main__":
    main(sys.argv[1])
