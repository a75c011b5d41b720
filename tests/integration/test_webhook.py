"""test_webhook.py - job webhooks against a receiver on loopback (http.server in this process).
A job asks for start, checkpoint and completed: each arrives once as a signed POST (HMAC-SHA256
over "TIMESTAMP.BODY" with the server's secret, DATA/webhook.secret, mode 0600), the first one
after a 500 is retried with the same delivery id, the unrequested events never come, and every
attempt is a "webhook" event of the job that says "delivered" or "failed" and nothing of what the
receiver answered. A receiver that holds its request holds up neither the job nor the deliveries
to another receiver. Bad webhook fields are 422 at their path. SSRF: loopback, private, link-local
and metadata addresses are refused unless --webhook-allow names them, written in the URL (422) or
reached by resolving a name (the delivery fails and nothing connects); --webhook-secret-file is
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

from serverlib import Server, check, need_fmnist, problem_ok, tiny, wait_for


class Receiver:
    def __init__(self):
        self.got = []            # (path, headers dict, body bytes)
        self.fail_first = {}     # path -> how many 500s are still owed
        self.release = threading.Event()
        self.hang_done = threading.Event()  # the held request was answered
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
                    rec.release.wait(120)
                    rec.hang_done.set()
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



def main(exe):
    need_fmnist()
    rec = Receiver()
    rec2 = Receiver()  # another receiver (another port): deliveries there run beside rec's
    s = Server(exe, args=["--webhook-backoff", "0.2", "--webhook-attempts", "3",
                          "--webhook-timeout", "90", "--webhook-allow", "127.0.0.1"]).start()
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
        return [(x[2]["event"], x[2]["attempt"], x[2]["result"], x[2]["ok"]) for x in e]
    wait_for(lambda: len(attempts()) == 5, "five webhook events")
    a = attempts()
    check(a[0] == ("start", 1, "failed", False) and a[1] == ("start", 2, "delivered", True),
          "attempts %s" % a)
    check(all(x[3] for x in a[1:]), "attempts %s" % a)
    first = [ev for ev in s.events(jid)[0] if ev[1] == "webhook"][0][2]
    check(first["retry_in_s"] == 0.2 and first["max_attempts"] == 3, "first attempt %s" % first)
    for ev in [ev for ev in s.events(jid)[0] if ev[1] == "webhook"]:
        check(set(ev[2]) == {"event", "delivery", "attempt", "max_attempts", "result", "ok",
                             "retry_in_s"}, "a webhook event says more than delivered/failed: %s"
              % ev[2])

    # a receiver that holds its request does not hold the job up
    r = s.request("POST", "/train", dict(tiny(steps=2), webhook={"url": rec.url("/hang"),
                                                                  "events": ["start"]}))
    check(r.status == 202, "POST /train (hang): %d" % r.status)
    j2 = r.json()["id"]
    wait_for(lambda: len(rec.bodies("/hang")) == 1, "the held request")
    j = s.wait_job(j2, lambda j: j["state"] == "succeeded", what="succeeded while the receiver holds")
    check(len(rec.bodies("/hang")) == 1, "more deliveries while the first is held")
    # ... nor the deliveries to another receiver: they arrive while it still holds (it would
    # hold for --webhook-timeout, 90 s, where one sender served every receiver in turn)
    r = s.request("POST", "/train", dict(tiny(steps=2), webhook={"url": rec2.url("/e"),
                                                                  "events": ["start", "completed"]}))
    check(r.status == 202, "POST /train (second receiver): %d" % r.status)
    wait_for(lambda: [b["event"] for _, b, _ in rec2.bodies("/e")] == ["start", "completed"],
             "the second receiver's deliveries while the first holds its request", timeout=80)
    check(not rec.hang_done.is_set() and len(rec.bodies("/hang")) == 1, "the held request ended")
    rec.release.set()
    s.stop()

    # --webhook-secret-file, and SSRF: only the names --webhook-allow lists reach loopback
    d = tempfile.mkdtemp(prefix="ddpmd-wh-")
    sf = os.path.join(d, "secret")
    with open(sf, "w") as f:
        f.write("a-secret-of-the-operators-own\n")
    t = Server(exe, args=["--webhook-secret-file", sf, "--webhook-allow", "localhost",
                          "--webhook-attempts", "1"]).start()
    check(not os.path.exists(os.path.join(t.data, "webhook.secret")), "a secret made despite the file")
    # an address in the URL: refused at once
    for url in ["http://127.0.0.1:%d/b" % rec.port, "http://[::1]:%d/b" % rec.port,
                "http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/x",
                "http://192.168.1.1/x", "http://172.16.0.1/x", "http://[fe80::1]/x",
                "http://[fd00:ec2::254]/x", "http://[::ffff:127.0.0.1]:%d/b" % rec.port,
                "http://2130706433:%d/b" % rec.port, "http://0x7f.1:%d/b" % rec.port,
                "http://0.0.0.0:%d/b" % rec.port]:
        problem_ok(t.request("POST", "/train", dict(tiny(steps=1), webhook={"url": url})), 422,
                   "webhook.url")
    # a name the allow list names: delivered (localhost resolves to loopback)
    r = t.request("POST", "/train", dict(tiny(steps=1), webhook={
        "url": "http://localhost:%d/b" % rec.port, "events": ["completed"]}))
    check(r.status == 202, "allowed host: %d %s" % (r.status, r.body[:200]))
    t.events(r.json()["id"])
    wait_for(lambda: len(rec.bodies("/b")) == 1, "the completed delivery")
    h, b, raw = rec.bodies("/b")[0]
    check(b["event"] == "completed", "event %s" % b["event"])
    signed_ok("a-secret-of-the-operators-own", h, raw)
    # a name it does not, resolving to loopback (as a rebinding name would): accepted, refused
    # when it resolves, nothing connects, and the job's event says only "failed"
    r = t.request("POST", "/train", dict(tiny(steps=1), webhook={
        "url": "http://rebind.localhost:%d/c" % rec.port, "events": ["completed"]}))
    check(r.status == 202, "a name: %d %s" % (r.status, r.body[:200]))
    jc = r.json()["id"]
    t.events(jc)
    wait_for(lambda: any(e[1] == "webhook" for e in t.events(jc)[0]), "the refused attempt")
    ev = [e[2] for e in t.events(jc)[0] if e[1] == "webhook"]
    check(len(ev) == 1 and ev[0]["result"] == "failed" and not ev[0]["ok"] and
          "status" not in ev[0] and "error" not in ev[0], "refused delivery's event %s" % ev)
    check(rec.bodies("/c") == [], "a delivery reached loopback through an unlisted name")
    t.stop()
    print("test_webhook: ok")


if __name__ == "__main__":
    main(sys.argv[1])
