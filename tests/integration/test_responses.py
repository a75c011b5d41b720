"""test_responses.py - the service's answers to a fixed set of requests, over a real socket,
against a recorded file (responses.expected beside it): status, the headers a client acts on and
the body of every route and of its refusals (auth, validation, idempotency, limits, ranges), a
training job's and a sampling job's event streams, logs and files. What differs between runs or
machines is normalised first: ids (J1, D1 in order of appearance), times, fractional numbers and
integers of 5+ digits (plan bytes depend on the CPU's kernels; timings on its load); binary
bodies are their type. A refactor that changes a byte of what is left fails here.
Usage: test_responses.py PATH/TO/ddpmd        (RECORD=1: write responses.expected instead)
"""
import difflib
import hashlib
import http.client
import json
import os
import re
import sys
import tempfile
import time

from serverlib import ROOT, Server, check, need_fmnist, tiny
from test_upload import png, tar

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "responses.expected")
ALICE, BOB = "alice-secret-0123456789", "bob-secret-0123456789ab"
# the headers a client acts on (Date, Content-Length of a normalised body and the like are not)
KEPT = ["Content-Type", "Location", "Allow", "Retry-After", "WWW-Authenticate", "Accept-Post",
        "Content-Range", "Content-Disposition", "Accept-Ranges", "Cache-Control",
        "X-Accel-Buffering", "Idempotent-Replayed", "X-Content-Type-Options",
        "Content-Security-Policy", "ETag", "X-Request-Id"]
# bodies compared with a file of the tree rather than recorded (other changes edit them)
ASSETS = {"/": "web/index.html", "/ui/app.js": "web/app.js", "/ui/style.css": "web/style.css"}


class Norm:
    """ids in order of appearance, times and machine-dependent numbers -> stable tokens"""

    def __init__(self):
        self.ids = {}

    def _id(self, m):
        k = m.group(0)
        if k not in self.ids:
            kind = "J" if k[0] == "j" else "D"
            self.ids[k] = "%s%d" % (kind, 1 + sum(1 for v in self.ids.values() if v[0] == kind))
        return self.ids[k]

    def text(self, s):
        s = re.sub(r"\b[jd][0-9a-f]{16}\b", self._id, s)
        s = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", s)
        s = re.sub(r'"\\"[0-9a-f]+-[0-9a-f]+-[0-9a-f]+\.[0-9a-f]+\\""|"[0-9a-f]+-[0-9a-f]+-[0-9a-f]+\.[0-9a-f]+"',
                   "<etag>", s)
        s = re.sub(r"(?<![\w.])-?\d+\.\d+(e[-+]?\d+)?", "<f>", s)
        s = re.sub(r"(?<![\w.<])-?\d+e[-+]?\d+", "<f>", s)
        s = re.sub(r"(?<![\w.])\d{5,}", "<N>", s)
        # timings by their names, whole numbers too ("img_per_s":3 when 3.00 was written)
        s = re.sub(r'"(img_per_s|images_per_s|step_s|eta_s|predicted_step_seconds)":-?[0-9<][^,}]*',
                   r'"\1":<t>', s)
        return s


def main(exe):
    need_fmnist()
    record = os.environ.get("RECORD") == "1"
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    tokfile = os.path.join(d, "tokens")
    with open(tokfile, "w") as f:
        f.write("alice %s admin\nbob %s\n" % (ALICE, BOB))
    os.chmod(tokfile, 0o600)  # a token file must be private (api_tokens_load)
    s = Server(exe, data=os.path.join(d, "data"),
               args=["--token-file", tokfile, "--vram-budget", "cpu=2GiB", "--cpu-cores", "2",
                     "--max-jobs-per-owner", "1", "--max-body", "65536"])
    os.makedirs(s.data)
    s.start()
    n = Norm()
    out = []
    seq = [0]

    def ex(label, method, path, body=None, headers=None, token=ALICE, binary=False):
        """one exchange, recorded; returns the response"""
        seq[0] += 1
        h = {"X-Request-Id": "rec-%d" % seq[0]}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        if token:
            h["Authorization"] = "Bearer " + token
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        hdrs, raw = r.getheaders(), r.read()
        c.close()
        out.append("### %s: %s %s" % (label, method, n.text(path)))
        out.append("status %d" % r.status)
        for k in KEPT:
            for hk, hv in hdrs:
                if hk.lower() == k.lower():
                    out.append("%s: %s" % (k, n.text(hv)))
        ctype = dict((k.lower(), v) for k, v in hdrs).get("content-type", "")
        if path in ASSETS and raw == open(os.path.join(ROOT, ASSETS[path]), "rb").read():
            out.append("body: <%s as in the tree>" % ASSETS[path])
        elif path == "/openapi.yaml":
            tree = open(os.path.join(ROOT, "openapi.yaml"), "rb").read()
            out.append("body: <openapi.yaml as in the tree>" if raw == tree else
                       "body: <openapi.yaml changed: sha256 %s>" % hashlib.sha256(raw).hexdigest())
        elif binary or not (ctype.startswith(("application/json", "application/problem+json",
                                              "text/")) or not raw):
            out.append("body: <%s>" % ("binary" if raw else "empty"))
        elif path.endswith("/metrics"):
            # the sample lines' names and labels (values move with time and load)
            out.append("body:")
            # (and the build's git revision, which moves with every commit)
            text = re.sub(r'revision="[^"]*"', 'revision="<rev>"', raw.decode())
            out.extend(l if l.startswith("#") else l.rsplit(" ", 1)[0] + " <v>"
                       for l in n.text(text).splitlines())
        else:
            body = n.text(raw.decode())
            if r.status == 202 and method == "POST":
                # a new job may be started before the answer reads it back: queued or running
                head = r'^(\{"id":"J\d+","kind":"\w+","owner":"\w+",)'
                body = re.sub(head + r'"state":"(queued|running)",', r'\1"state":<queued or running>,', body)
                body = re.sub(head + r'("state":<queued or running>,(?:"name":(?:null|"[^"]*"),'
                              r'"labels":\{[^{}]*\},)?"threads":)(null|1),', r'\1\2<null or 1>,', body)
                body = re.sub(r'^(\{(?:[^{}]|\{[^{}]*\})*?,)"device":(null|"cpu"),',
                              r'\1"device":<null or "cpu">,', body)
                body = re.sub(r'"started_at":(null|"<time>")', '"started_at":<null or time>', body)
                body = re.sub(r'"starts":[01],', '"starts":<0 or 1>,', body)
            out.append("body: " + body)
        return r, raw

    def js(r):
        return json.loads(r[1])

    def wait_state(jid, states, token=ALICE, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = s.get_json("/jobs/" + jid, token=token)
            if j["state"] in states:
                return j
            time.sleep(0.1)
        check(False, "job %s not in %s" % (jid, states))

    def events(label, jid, token=ALICE):
        """the job's whole stream: its headers, its events (logs apart: their place among the
        others depends on which of the child's pipes is read first)"""
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.request("GET", "/jobs/%s/events" % jid,
                  headers={"Authorization": "Bearer " + token, "X-Request-Id": "rec-events"})
        r = c.getresponse()
        text = r.read().decode()
        out.append("### %s: GET /jobs/%s/events" % (label, n.text(jid)))
        out.append("status %d" % r.status)
        for k in KEPT:
            v = r.getheader(k)
            if v:
                out.append("%s: %s" % (k, v))
        evs, logs, last = [], [], 0
        for block in text.split("\n\n"):
            f = dict(l.split(": ", 1) for l in block.splitlines() if ": " in l and l[0] != ":")
            if "data" not in f:
                continue
            check(int(f["id"]) > last, "event ids not increasing: %s" % text[:400])
            last = int(f["id"])
            # progress is rate-limited (one per 500 ms per kind): which ones pass depends on the
            # clock, so only those always kept are recorded (a phase's end, the last step, a
            # step with a validation loss)
            d = json.loads(f["data"])
            if f["event"] == "progress" and not (
                    "val_loss" in d or d.get("done", 0) == d.get("total", -1) or
                    d.get("step", 0) == d.get("steps", -1)):
                continue
            (logs if f["event"] == "log" else evs).append(
                "%s %s" % (f["event"], n.text(f["data"])))
        out.append("events:")
        out.extend("  " + e for e in evs)
        out.append("logs:")
        out.extend("  " + e for e in logs)

    train = tiny()
    # ---- anything: health, the contract, the page ----
    ex("healthz", "GET", "/healthz", token=None)
    ex("readyz", "GET", "/readyz", token=None)
    ex("openapi", "GET", "/openapi.yaml", token=None)
    for p in ASSETS:
        ex("page", "GET", p, token=None)
    ex("no route", "GET", "/nothing/here")
    ex("method", "DELETE", "/jobs")
    ex("no token", "GET", "/jobs", token=None)
    ex("bad token", "GET", "/jobs", token="nope-nope-nope-nope")
    ex("devices", "GET", "/devices")
    # ---- POST /train refused ----
    ex("train: content type", "POST", "/train", json.dumps(train), {"Content-Type": "text/plain"})
    ex("train: malformed", "POST", "/train", "{\"model\": ", {"Content-Type": "application/json"})
    ex("train: too large", "POST", "/train", "x" * 70000, {"Content-Type": "application/json"})
    ex("train: invalid", "POST", "/train", {"model": {"preset": "nope"}, "train": {"batch": 0},
                                            "extra": 1})
    bad = tiny()
    bad["data"]["dataset"] = "d0123456789abcdef"
    ex("train: unknown dataset", "POST", "/train", bad)
    bad = tiny()
    bad["init_from"] = "/etc/passwd"
    ex("train: init_from form", "POST", "/train", bad)
    bad["init_from"] = "j0123456789abcdef-3"
    ex("train: init_from missing", "POST", "/train", bad)
    bad = tiny()
    bad["webhook"] = {"url": "ftp://example.com/x", "events": ["nope"]}
    ex("train: webhook", "POST", "/train", bad)
    bad = tiny()
    # f32 pinned: which 16-bit plan is smallest depends on the CPU's bf16 kernels (AVX512-BF16)
    bad["memory"] = {"vram_budget": 4096, "precision": "f32"}
    ex("train: never fits", "POST", "/train", bad)
    ex("train: idem key", "POST", "/train", train, {"Idempotency-Key": "has space"})
    # ---- bob: a long job, the per-owner limit, a cancel while it runs ----
    long_job = tiny(steps=100000, checkpoint_every=0, log_every=100000)
    rb = ex("bob: train", "POST", "/train", long_job, token=BOB)
    bob_job = js(rb)["id"]
    ex("bob: owner limit", "POST", "/train", long_job, token=BOB)
    ex("bob: alice's list", "GET", "/jobs?owner=alice", token=BOB)
    wait_state(bob_job, ("running",), token=BOB)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", "/jobs/%s/cancel" % bob_job, headers={"Authorization": "Bearer " + BOB})
    r = c.getresponse()
    out.append("### bob: cancel while running")
    out.append("status %d cancel_requested %s" % (r.status, json.loads(r.read())["cancel_requested"]))
    c.close()
    wait_state(bob_job, ("canceled",), token=BOB)
    ex("bob: cancel again", "POST", "/jobs/%s/cancel" % bob_job, token=BOB)
    # ---- alice: a training job from start to end ----
    r = ex("train", "POST", "/train", train, {"Idempotency-Key": "k-train-1"})
    job = js(r)["id"]
    ex("train: replayed", "POST", "/train", train, {"Idempotency-Key": "k-train-1"})
    ex("train: key reused", "POST", "/train", tiny(steps=7), {"Idempotency-Key": "k-train-1"})
    ex("bob: alice's job", "GET", "/jobs/" + job, token=BOB)
    wait_state(job, ("succeeded", "failed", "canceled"))
    ex("job", "GET", "/jobs/" + job)
    events("events", job)
    ex("events: last id", "GET", "/jobs/%s/events" % job, headers={"Last-Event-ID": "x"})
    ex("jobs", "GET", "/jobs?kind=train&limit=1")
    ex("jobs: bad state", "GET", "/jobs?state=done")
    ex("jobs: bad limit", "GET", "/jobs?limit=0")
    ex("jobs: bad after", "GET", "/jobs?after=x")
    ex("jobs: bad kind", "GET", "/jobs?kind=x")
    ex("job: bad id", "GET", "/jobs/nope")
    ex("job: unknown", "GET", "/jobs/j0000000000000000")
    ex("logs", "GET", "/jobs/%s/logs" % job)
    ex("loss.csv", "GET", "/jobs/%s/loss.csv" % job)
    ex("loss.png", "GET", "/jobs/%s/loss.png" % job)
    ex("grid", "GET", "/jobs/%s/grids/6.png" % job)
    ex("grid: none", "GET", "/jobs/%s/grids/5.png" % job)
    ex("grid: bad", "GET", "/jobs/%s/grids/05.png" % job)
    ex("checkpoints", "GET", "/jobs/%s/checkpoints" % job)
    ck = "%s-6" % job
    r = ex("checkpoint", "GET", "/checkpoints/" + ck, binary=True)
    ck_blob = r[1]
    etag = dict(r[0].getheaders())["ETag"]
    ex("checkpoint: range", "GET", "/checkpoints/" + ck, headers={"Range": "bytes=0-9"},
       binary=True)
    ex("checkpoint: bad range", "GET", "/checkpoints/" + ck,
       headers={"Range": "bytes=999999999-"})
    ex("checkpoint: not modified", "GET", "/checkpoints/" + ck, headers={"If-None-Match": etag})
    ex("checkpoint: format", "GET", "/checkpoints/%s?format=onnx" % ck)
    ex("checkpoint: diffusers", "GET", "/checkpoints/%s?format=diffusers" % ck, binary=True)
    ex("checkpoint: pruned", "GET", "/checkpoints/%s-1" % job)
    ex("checkpoint: bad id", "GET", "/checkpoints/x-1")
    ex("cancel: ended", "POST", "/jobs/%s/cancel" % job)
    # ---- sampling ----
    ex("samples: content type", "POST", "/samples", "{}", {"Content-Type": "text/plain"})
    ex("samples: invalid", "POST", "/samples", {"n": 0, "sampler": "x", "eta": 2, "ema": 1,
                                                "what": 1})
    ex("samples: both", "POST", "/samples", {"job": job, "checkpoint": ck})
    ex("samples: no job", "POST", "/samples", {"job": "j0000000000000000"})
    ex("samples: steps", "POST", "/samples", {"checkpoint": ck, "steps": 5000})
    r = ex("samples", "POST", "/samples", {"job": job, "n": 2, "steps": 2, "batch": 2, "seed": 3})
    sid = js(r)["id"]
    wait_state(sid, ("succeeded", "failed", "canceled"))
    ex("sample", "GET", "/samples/" + sid)
    events("sample events", sid)
    ex("samples list", "GET", "/samples")
    ex("sample grid", "GET", "/samples/%s.png" % sid)
    ex("sample image", "GET", "/samples/%s/images/1.png" % sid)
    ex("sample image: none", "GET", "/samples/%s/images/2.png" % sid)
    ex("sample image: bad", "GET", "/samples/%s/images/01.png" % sid)
    ex("sample: a training job", "GET", "/samples/" + job)
    # ---- the job API: filters, resume, import, delete ----
    ex("jobs: by label", "GET", "/jobs?label=team:none")
    ex("jobs: bad label", "GET", "/jobs?label=novalue")
    ex("resume: succeeded", "POST", "/jobs/%s/resume" % job)
    ex("resume: bob's", "POST", "/jobs/%s/resume" % job, token=BOB)
    octet = {"Content-Type": "application/octet-stream"}
    ex("import: content type", "POST", "/checkpoints", b"x", {"Content-Type": "text/plain"})
    ex("import: not safetensors", "POST", "/checkpoints", b"\x10" + b"\0" * 7 + b"{}", octet)
    r = ex("import", "POST", "/checkpoints?name=again", ck_blob, octet)
    imp = js(r)["id"]
    ex("import: job", "GET", "/jobs/" + imp)
    ex("delete: bob's", "DELETE", "/jobs/" + imp, token=BOB)
    ex("delete", "DELETE", "/jobs/" + imp)
    ex("delete: gone", "GET", "/jobs/" + imp)
    # ---- datasets ----
    ex("datasets", "GET", "/datasets")
    ex("datasets: content type", "POST", "/datasets", b"x", {"Content-Type": "text/plain"})
    ex("datasets: not a tar", "POST", "/datasets", b"not a tar at all" * 64,
       {"Content-Type": "application/x-tar"})
    archive = tar([("a.png", png(8, 8)), ("b.png", png(8, 8, value=40))])
    r = ex("datasets: upload", "POST", "/datasets", archive, {"Content-Type": "application/x-tar"})
    did = js(r)["id"]
    for _ in range(600):  # answered validating; ready once the upload worker decoded it
        if s.get_json("/datasets/" + did, token=ALICE)["state"] != "validating":
            break
        time.sleep(0.05)
    ex("dataset", "GET", "/datasets/" + did)
    ex("dataset: bob", "GET", "/datasets/" + did, token=BOB)
    ex("dataset: preview", "GET", "/datasets/%s/preview.png" % did)
    ex("dataset: builtin", "GET", "/datasets/fashion-mnist")
    ex("dataset: builtin preview", "GET", "/datasets/fashion-mnist/preview.png")
    ex("dataset: builtin delete", "DELETE", "/datasets/fashion-mnist")
    ex("dataset: delete", "DELETE", "/datasets/" + did)
    ex("dataset: gone", "GET", "/datasets/" + did)
    ex("devices: after", "GET", "/devices")
    ex("metrics", "GET", "/metrics")
    check(s.stop() == 0, "the server did not stop cleanly")

    text = "\n".join(out) + "\n"
    if record:
        open(EXPECTED, "w").write(text)
        print("test_responses: recorded %d exchanges in %s" % (seq[0], EXPECTED))
        return
    want = open(EXPECTED).read()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            "responses.expected", "this run", n=2))
        print(diff[:20000])
        check(False, "the responses differ from responses.expected (RECORD=1 records them)")
    print("test_responses: ok (%d exchanges)" % seq[0])


if __name__ == "__main__":
    main(sys.argv[1])
