"""test_export_race.py - a diffusers export being built meets a DELETE and a second request for
the same checkpoint. The build is held inside its tar write (the stall_fsync shim holds the fsync
of the tar's temporary until the test releases it: an event, never a sleep). Meanwhile:
DELETE /jobs/{id} is 409 export-in-progress with Retry-After, from the owner and from an admin,
and the job, its checkpoint and the build's folder stay; an admin's export of the same checkpoint
(the owner's one-build limit does not apply to another owner) is 503 with Retry-After and starts
no second build (one build folder, one temporary tar). Released, the build answers 200 with the
tar it cached (no temporaries left), a second request is served the same file, and the DELETE
then goes through and removes all of it. Usage: test_export_race.py PATH/TO/ddpmd
"""
import os
import sys
import tempfile
import threading

from serverlib import Server, check, need_fmnist, problem_ok, tiny, wait_for

ALICE = "alice-secret-0123456789"
ROOT = "root-secret-0123456789ab"



def main(exe):
    need_fmnist()
    tmp = tempfile.mkdtemp(prefix="ddpmd-export-race-")
    release, mark = os.path.join(tmp, "release"), os.path.join(tmp, "mark")
    shim = os.path.join(os.path.dirname(os.path.abspath(exe)), "libddpmd_stall_fsync.so")
    check(os.path.exists(shim), "the shim %s is not built" % shim)
    tok = os.path.join(tmp, "tokens")
    with open(tok, "w") as f:
        f.write("alice %s\nroot %s admin\n" % (ALICE, ROOT))
    os.chmod(tok, 0o600)
    asan = os.environ.get("ASAN_OPTIONS", "")
    env = {"LD_PRELOAD": shim, "STALL_FSYNC_MATCH": ".diffusers.tar.tmp.",
           "STALL_FSYNC_MARK": mark, "STALL_FSYNC_RELEASE": release,
           "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
    s = Server(exe, args=["--token-file", tok], env=env).start()
    s.token = ALICE
    jid = s.request("POST", "/train", tiny(steps=1, checkpoint_every=1)).json()["id"]
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="done")
    cid = "%s-1" % jid
    url = "/checkpoints/%s?format=diffusers" % cid
    jobdir = os.path.join(s.data, "jobs", jid)
    ckdir = os.path.join(jobdir, "out", "checkpoints")
    ckpt = os.path.join(ckdir, "step-00000001.safetensors")
    cache = os.path.join(ckdir, "step-00000001.diffusers.tar")

    def building():
        names = os.listdir(ckdir)
        return ([n for n in names if ".diffusers.tar.build-" in n],
                [n for n in names if ".diffusers.tar.tmp." in n])

    # alice's export, held in the fsync of its tar
    got = {}
    t = threading.Thread(target=lambda: got.update(r=s.request("GET", url, timeout=300)))
    t.start()
    wait_for(lambda: os.path.exists(mark) and os.path.getsize(mark) > 0, "the held export write")
    check(building() != ([], []), "no build in the checkpoint's folder")

    # DELETE while it builds: 409 export-in-progress, for the owner and for an admin
    for who in (ALICE, ROOT):
        r = s.request("DELETE", "/jobs/" + jid, token=who)
        p = problem_ok(r, 409)
        check(p["type"].endswith("export-in-progress"), "type %s" % p["type"])
        check(r.header("Retry-After"), "409 without Retry-After")
    check(s.request("GET", "/jobs/" + jid).status == 200, "the job went with the 409")
    check(os.path.exists(ckpt), "the checkpoint went with the 409")

    # the same checkpoint's export from another owner: refused, not built a second time
    builds, tmps = building()
    r = s.request("GET", url, token=ROOT)
    problem_ok(r, 503)
    check(r.header("Retry-After"), "503 without Retry-After")
    check(building() == (builds, tmps) and len(builds) == 1 and len(tmps) == 1,
          "a second build: %s, then %s" % ((builds, tmps), building()))

    # released: the one build completes, consistent, and is what everyone is served
    open(release, "w").close()
    t.join()
    r = got["r"]
    check(r.status == 200, "the held export: %d %s" % (r.status, r.body[:300]))
    check(os.path.exists(cache) and open(cache, "rb").read() == r.body, "no cache, or not the body")
    check(building() == ([], []), "temporaries left: %s" % (building(),))
    ino = os.stat(cache).st_ino
    r2 = s.request("GET", url, token=ROOT)
    check(r2.status == 200 and r2.body == r.body and os.stat(cache).st_ino == ino,
          "the admin's request after the build was not served the cached tar")

    # nothing builds now: the DELETE goes, with every file
    check(s.request("DELETE", "/jobs/" + jid).status == 204, "DELETE after the build")
    check(not os.path.exists(jobdir), "the job's folder stayed")
    problem_ok(s.request("GET", url), 404)
    check(s.stop() == 0, "exit status")
    print("test_export_race: ok (%d-byte tar, built once)" % len(r.body))


if __name__ == "__main__":
    main(sys.argv[1])
