"""test_webhook.py - job webhooks against a receiver on loopback (http.server in this process).
A job asks for start, checkpoint and completed: each arrives once as a signed POST (HMAC-SHA256
over "TIMESTAMP.BODY" with the server's secret, DATA/webhook.secret, mode 0600), the first one
after a 500 is retried with the same delivery id, the unrequested events never come, and every
attempt is a "webhook" event of the job. A receiver that holds its request does not hold up the
job. Bad webhook fields are 422 at their path; --webhook-allow and --webhook-secret-file are
honoured. Usage: test_webhook.py PATH/TO/ddpmd
"""
import hashlib
import hmac
import http.server
import json
import os
import stat
import sys
import tempfile
import threading
import time

from serverlib import Server, check, need_fmnist, problem_ok, tiny


class Receiver:
    def __init__(self):
        self.got = []            # (path, headers dict, body bytes)
        self.fail_first = {}     # path -> how many 500s are still owed
        self.release = threading.Event()
        self.lock = threading.Lock()
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with rec.lock:
                    rec.got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    owed = rec.fail_first.get(self.path, 0)
                    if owed:
                        rec.fail_first[self.path] = owed - 1
                if self.path == "/hang":
                    rec.release.wait(60)
                self.send_response(500 if owed else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def bodies(self, path):
        with self.lock:
            return [(h, json.loads(b), b) for p, h, b in self.got if p == path]


def signed_ok(secret, h, raw):
    ts = h.get("x-ddpmd-timestamp", "")
    want = "sha256=" + hmac.new(secret.encode(), ts.encode() + b"." + raw, hashlib.sha256).hexdigest()
    check(hmac.compare_digest(h.get("x-ddpmd-signature", ""), want),
          "bad signature %r for timestamp %r" % (h.get("x-ddpmd-signature"), ts))
    check(abs(int(ts) - time.time()) < 300, "timestamp %s far from now" % ts)
    check(h.get("content-type") == "application/json", "content type %r" % h.get("content-type"))


def wait_for(pred, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    check(False, "timed out waiting for " + what)


def main(exe):
    need_fmnist()
    rec = Receiver()
    s = Server(exe, args=["--webhook-backoff", "0.2", "--webhook-attempts", "3",
                          "--webhook-timeout", "30"]).start()
    spath = os.path.join(s.data, "webhook.secret")
    check(stat.S_IMODE(os.stat(spath).st_mode) == 0o600, "secret mode %o" % os.stat(spath).st_mode)
    secret = open(spath).read().strip()
    check(len(secret) == 64, "secret length %d" % len(secret))

    # bad webhook fields: 422 at the field, nothing stored
    for wh, path in [({"url": "ftp://127.0.0.1/x"}, "webhook.url"),
                     ({"url": "file:///etc/passwd"}, "webhook.url"),
                     ({"url": "not a url"}, "webhook.url"),
                     ({"url": 5}, "webhook.url"),
                     ({"url": rec.url("/a"), "events": ["start", "bogus"]}, "webhook.events"),
                     ({"url": rec.url("/a"), "events": []}, "webhook.events"),
                     ({"url": rec.url("/a"), "secret": "x"}, "webhook.secret"),
                     ("http://x", "webhook")]:
        problem_ok(s.request("POST", "/train", dict(tiny(steps=1), webhook=wh)), 422, path)
    check(s.get_json("/jobs")["jobs"] == [], "a refused webhook stored a job")

    # a job with three events of six; its first delivery gets a 500 and is retried
    rec.fail_first["/a"] = 1
    spec = tiny(steps=4, checkpoint_every=2, sample_every=2, samples=1)
    r = s.request("POST", "/train", dict(spec, webhook={"url": rec.url("/a"),
                                                         "events": ["start", "checkpoint", "completed"]}))
    check(r.status == 202, "POST /train with a webhook: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    check("webhook" not in json.dumps(r.json()["spec"]), "the webhook shows in the job's spec")
    evs, _ = s.events(jid)
    check(s.get_json("/jobs/" + jid)["state"] == "succeeded", "the job did not succeed")
    wait_for(lambda: any(b["event"] == "completed" for _, b, _ in rec.bodies("/a")), "completed")
    got = rec.bodies("/a")
    names = [b["event"] for _, b, _ in got]
    check(names[:2] == ["start", "start"], "start then its retry: %s" % names)
    check(names[2:] == ["checkpoint", "checkpoint", "completed"], "events %s" % names)
    check(got[0][1]["delivery"] == got[1][1]["delivery"], "a retry with another delivery id")
    check(len({b["delivery"] for _, b, _ in got}) == 4, "delivery ids %s" % [b["delivery"] for _, b, _ in got])
    for h, b, raw in got:
        signed_ok(secret, h, raw)
        check(h.get("x-ddpmd-event") == b["event"] and h.get("x-ddpmd-delivery") == b["delivery"],
              "headers %s" % h)
        check(b["job"]["id"] == jid, "body job %s" % b["job"])
    check(got[-1][1]["job"]["state"] == "succeeded", "completed body state %s" % got[-1][1]["job"]["state"])
    check([b["data"]["step"] for _, b, _ in got if b["event"] == "checkpoint"] == [2, 4],
          "checkpoint steps")
    # the attempts are the job's events (the last ones may come after the stream ended)
    def attempts():
        e = [ev for ev in s.events(jid)[0] if ev[1] == "webhook"]
        return [(x[2]["event"], x[2]["attempt"], x[2]["status"], x[2]["ok"]) for x in e]
    wait_for(lambda: len(attempts()) == 5, "five webhook events")
    a = attempts()
    check(a[0] == ("start", 1, 500, False) and a[1] == ("start", 2, 200, True), "attempts %s" % a)
    check(all(x[3] for x in a[1:]), "attempts %s" % a)
    first = [ev for ev in s.events(jid)[0] if ev[1] == "webhook"][0][2]
    check(first["retry_in_s"] == 0.2 and first["max_attempts"] == 3, "first attempt %s" % first)

    # a receiver that holds its request does not hold the job up
    r = s.request("POST", "/train", dict(tiny(steps=2), webhook={"url": rec.url("/hang"),
                                                                  "events": ["start"]}))
    check(r.status == 202, "POST /train (hang): %d" % r.status)
    j2 = r.json()["id"]
    wait_for(lambda: len(rec.bodies("/hang")) == 1, "the held request")
    j = s.wait_job(j2, lambda j: j["state"] == "succeeded", what="succeeded while the receiver holds")
    check(len(rec.bodies("/hang")) == 1, "more deliveries while the first is held")
    rec.release.set()
    s.stop()

    # --webhook-secret-file and --webhook-allow
    d = tempfile.mkdtemp(prefix="ddpmd-wh-")
    sf = os.path.join(d, "secret")
    with open(sf, "w") as f:
        f.write("a-secret-of-the-operators-own\n")
    t = Server(exe, args=["--webhook-secret-file", sf, "--webhook-allow", "127.0.0.1,example.org"]).start()
    check(not os.path.exists(os.path.join(t.data, "webhook.secret")), "a secret made despite the file")
    problem_ok(t.request("POST", "/train", dict(tiny(steps=1), webhook={
        "url": "http://localhost:%d/b" % rec.port})), 422, "webhook.url")
    r = t.request("POST", "/train", dict(tiny(steps=1), webhook={"url": rec.url("/b"),
                                                                  "events": ["completed"]}))
    check(r.status == 202, "allowed host: %d %s" % (r.status, r.body[:200]))
    t.events(r.json()["id"])
    wait_for(lambda: len(rec.bodies("/b")) == 1, "the completed delivery")
    h, b, raw = rec.bodies("/b")[0]
    check(b["event"] == "completed", "event %s" % b["event"])
    signed_ok("a-secret-of-the-operators-own", h, raw)
    t.stop()
    print("test_webhook: ok")


if __name__ == "__main__":
    main(sys.argv[1])
