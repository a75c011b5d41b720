"""serverlib.py - a real `ddpmd serve` on an ephemeral loopback port for the integration tests:
start (reads the JSON line with the port), HTTP calls through http.client, a Server-Sent Events
reader, openapi.yaml schema checks, and a stop that always happens (SIGTERM, then SIGKILL).
"""
import atexit
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jsonschema
import yaml

# PIN_CPU=N (tests/README.md): the test and every server and job it starts run on CPU N alone,
# as on a one-core machine, where an HTTP thread starved by a planner or a child would show
if os.environ.get("PIN_CPU"):
    os.sched_setaffinity(0, {int(os.environ["PIN_CPU"])})

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPENAPI = yaml.safe_load(open(os.path.join(ROOT, "openapi.yaml")))

# a few steps of the fmnist-tiny preset at a small batch: seconds on one core
TINY = {
    "model": {"preset": "ddpm", "in_channels": 1, "image_size": 32,
              "block_out_channels": [32, 64, 64], "layers_per_block": 1,
              "attention_resolutions": [8], "norm_num_groups": 8},
    "data": {"dataset": "fashion-mnist"},
    "train": {"batch": 2, "steps": 6, "threads": 1, "warmup": 1, "ema_decay": 0.9},
    "output": {"checkpoint_every": 3, "sample_every": 0, "log_every": 1, "keep_last": 2,
               "samples": 1},
}

_servers = []


def tiny(**over):
    """TINY with train/output fields replaced: tiny(steps=40, checkpoint_every=4)"""
    s = json.loads(json.dumps(TINY))
    for k, v in over.items():
        (s["train"] if k in s["train"] or k in ("lr", "seed") else s["output"])[k] = v
    return s


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise AssertionError(msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def wait_for(pred, what, timeout=120):
    """polls pred until it holds; the timeout is a hang guard only (the condition must be an
    event the test caused, never a guess at how fast something runs)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    check(False, "timed out waiting for " + what)


def need_fmnist():
    if not os.path.exists("/usr/share/datasets/fashion-mnist"):
        print("SKIP: the Debian package dataset-fashion-mnist is not installed")
        sys.exit(77)


def validate(obj, schema_name):
    """obj against components/schemas/<schema_name> of openapi.yaml"""
    schema = {"$ref": "#/components/schemas/" + schema_name, "components": OPENAPI["components"]}
    jsonschema.Draft202012Validator(schema).validate(obj)


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


class Server:
    def __init__(self, exe, data=None, args=(), env=None):
        self.exe = exe
        self.own_data = data is None
        self.data = data or tempfile.mkdtemp(prefix="ddpmd-it-")
        self.args = list(args)
        self.env = env
        self.proc = None
        self.token = None
        # where requests go: the server's own port and routes, or set them to a reverse proxy's
        # port and path prefix (test_nginx.py, test_prefix.py)
        self.via_port = None
        self.prefix = ""
        _servers.append(self)

    def start(self, timeout=60):
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen(
            [self.exe, "serve", "--listen", "127.0.0.1:0", "--data", self.data, *self.args],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.data, "server.log"), "ab"),
            env=env)
        deadline = time.time() + timeout
        line = b""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if line or self.proc.poll() is not None:
                break
        check(line, "the server printed no listening line (see %s/server.log)" % self.data)
        info = json.loads(line)
        self.port = info["port"]
        return self

    def log(self):
        try:
            return open(os.path.join(self.data, "server.log")).read()
        except OSError:
            return ""

    def request(self, method, path, body=None, headers=None, token=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.via_port or self.port, timeout=timeout)
        h = dict(headers or {})
        tok = token if token is not None else self.token
        if tok:
            h["Authorization"] = "Bearer " + tok
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, self.prefix + path, body=body, headers=h)
        r = c.getresponse()
        out = Response(r.status, r.getheaders(), r.read())
        c.close()
        return out

    def get_json(self, path, **kw):
        r = self.request("GET", path, **kw)
        check(r.status == 200, "GET %s: %d %s" % (path, r.status, r.body[:300]))
        return r.json()

    def events(self, job, last_event_id=None, timeout=120, until=None):
        """the job's SSE stream to its end (or until(event) is true): [(id, type, data)], headers"""
        c = http.client.HTTPConnection("127.0.0.1", self.via_port or self.port, timeout=timeout)
        h = {"Accept": "text/event-stream"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if last_event_id is not None:
            h["Last-Event-ID"] = str(last_event_id)
        c.request("GET", self.prefix + "/jobs/%s/events" % job, headers=h)
        r = c.getresponse()
        if r.status != 200:
            fail("events: %d %s" % (r.status, r.read()[:300]))
        hdrs = r.getheaders()
        out, cur = [], {}
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if line == "":
                if "data" in cur:
                    ev = (int(cur["id"]), cur.get("event", "message"), json.loads(cur["data"]))
                    out.append(ev)
                    if until and until(ev):
                        break
                cur = {}
            elif line.startswith(":"):
                continue
            else:
                k, _, v = line.partition(": ")
                cur[k] = v
        else:
            fail("the event stream of %s did not end in %d s" % (job, timeout))
        c.close()
        return out, hdrs

    def wait_job(self, job, pred, timeout=120, what="the condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.get_json("/jobs/" + job)
            if pred(j):
                return j
            if j["state"] in ("succeeded", "failed", "canceled"):
                break  # ended without the condition: it never will
            time.sleep(0.1)
        fail("job %s: %s not reached (last: %s)" % (job, what, j))

    def stop(self, sig=signal.SIGTERM, timeout=90):
        """signals the server and waits; returns its exit status"""
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            fail("the server did not stop within %d s of signal %d" % (timeout, sig))

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.own_data:
            shutil.rmtree(self.data, ignore_errors=True)


def job_processes(data_dir):
    """pids of processes whose command line names data_dir (the job children)"""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"train" in cmd and any(data_dir.encode() in a for a in cmd):
            pids.append(int(p))
    return pids


@atexit.register
def _cleanup_all():
    for s in _servers:  # every server first, then the folders they shared
        if s.proc and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    for s in _servers:
        for pid in job_processes(s.data):  # only after a failure: a job process left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        s.cleanup()


def problem_ok(r, status, path=None):
    """an RFC 9457 body with this status (and an errors[] entry for path)"""
    check(r.status == status, "expected %d, got %d: %s" % (status, r.status, r.body[:300]))
    ct = r.header("Content-Type") or ""
    check(ct.startswith("application/problem+json"), "content type %r" % ct)
    p = r.json()
    validate(p, "Problem")
    check(p["status"] == status and p["title"] and p["detail"], "problem body %s" % p)
    if path is not None:
        paths = [e["path"] for e in p.get("errors", [])]
        check(path in paths, "no error at %r in %s" % (path, p))
    return p
