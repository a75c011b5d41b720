"""test_permissions.py - the data directory is its owner's alone, whatever the umask the server
starts with: a server started with umask 000 in a data folder that was 0755 makes every file it
writes 0600 and every folder 0700 - the store, the lock, the webhook secret and a job's webhook
URL, spec, checkpoints, samples, loss chart, an upload's PNGs - and the data folder 0700.
Usage: test_permissions.py PATH/TO/ddpmd
"""
import os
import shutil
import stat
import sys
import tempfile
import time

from serverlib import Server, check, need_fmnist, tiny
from test_upload import png, tar


def main(exe):
    need_fmnist()
    os.umask(0)  # the server and its children inherit it
    data = tempfile.mkdtemp(prefix="ddpmd-perm-")
    os.chmod(data, 0o755)
    s = Server(exe, data=data, args=["--webhook-allow", "127.0.0.1"]).start()
    r = s.request("POST", "/datasets", body=tar([("a.png", png(8, 8)), ("b/c.png", png(8, 8))]),
                  headers={"Content-Type": "application/x-tar"})
    check(r.status == 202, "POST /datasets: %d %s" % (r.status, r.body[:200]))
    did = r.json()["id"]
    for _ in range(600):  # its images decoded (and its preview written) on the upload worker
        if s.get_json("/datasets/" + did)["state"] != "validating":
            break
        time.sleep(0.05)
    check(s.get_json("/datasets/" + did)["state"] == "ready", "the upload is not ready")
    # a webhook to a closed port: its URL is stored, its delivery fails, nothing waits for it
    spec = tiny(steps=2, checkpoint_every=1, sample_every=2, samples=1)
    r = s.request("POST", "/train", dict(spec, webhook={"url": "http://127.0.0.1:9/secret-token",
                                                        "events": ["completed"]}))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:200]))
    jid = r.json()["id"]
    s.events(jid)
    check(s.get_json("/jobs/" + jid)["state"] == "succeeded", "the job did not succeed")
    check(s.stop() == 0, "exit status")
    seen, bad = {"files": 0, "dirs": 1}, []
    mode = stat.S_IMODE(os.stat(data).st_mode)
    if mode != 0o700:
        bad.append("%s %o" % (data, mode))
    for root, dirs, files in os.walk(data):
        for d in dirs:
            p = os.path.join(root, d)
            seen["dirs"] += 1
            if stat.S_IMODE(os.lstat(p).st_mode) != 0o700:
                bad.append("%s %o" % (p, stat.S_IMODE(os.lstat(p).st_mode)))
        for f in files:
            p = os.path.join(root, f)
            if p == os.path.join(data, "server.log"):
                continue  # the test's own log of the server's stderr
            seen["files"] += 1
            if stat.S_IMODE(os.lstat(p).st_mode) & 0o077:
                bad.append("%s %o" % (p, stat.S_IMODE(os.lstat(p).st_mode)))
    names = set()
    for root, dirs, files in os.walk(data):
        names.update(files)
    for want in ("webhook.json", "webhook.secret", "spec.json", "loss.png", "ddpmd.lock"):
        check(want in names, "no %s among the files checked: %s" % (want, sorted(names)[:40]))
    check(any(n.endswith(".safetensors") for n in names), "no checkpoint among the files checked")
    check(any(n.endswith(".png") and n not in ("loss.png",) for n in names), "no PNGs checked")
    check(not bad, "readable by others: %s" % bad[:20])
    shutil.rmtree(data, ignore_errors=True)
    print("test_permissions: ok (%d files 0600, %d folders 0700)" % (seen["files"], seen["dirs"]))


if __name__ == "__main__":
    main(sys.argv[1])
