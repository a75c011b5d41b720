"""test_nginx.py - docker/nginx.conf with Debian's nginx (started here, not as a daemon, its pid
and temporary files in a temporary folder) in front of a real `ddpmd serve --path-prefix /ddpmd`
on loopback; everything below goes through nginx at /ddpmd/:
- POST /train: 202 with Location /ddpmd/jobs/{id};
- its event stream is not buffered: the job's process is frozen (SIGSTOP) mid-run, and every
  event the server has logged by then (read from the server directly) must still arrive through
  nginx while the job is running and frozen, keep-alive comments too; after SIGCONT the stream
  runs to the end, every event once, in order, each checkpoint event's url under the prefix;
- the checkpoint downloads through nginx byte for byte (and a Range of it), POST /samples, the
  grid PNG byte for byte;
- uploads: a 2 MiB body reaches ddpmd (its problem+json, not nginx's 413 page:
  client_max_body_size), and ddpmd answers a request announcing 64 MiB (413, in its access log)
  after its first 64 KiB, before the body is complete (proxy_request_buffering off streams the
  body instead of spooling it all first).
Skips (77) without nginx (Debian package nginx, scripts/install-deps.sh).
Usage: test_nginx.py PATH/TO/ddpmd
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from serverlib import ROOT, Server, check, fail, job_processes, need_fmnist, problem_ok, tiny
from test_samples import png_size, wait_sample

P = "/ddpmd"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Nginx:
    """docker/nginx.conf rendered for these ports, run in the foreground from a temporary folder"""

    def __init__(self, upstream_port):
        self.dir = tempfile.mkdtemp(prefix="ddpmd-nginx-")
        os.chmod(self.dir, 0o755)  # the worker (nobody when run as root) creates its temp files
        self.port = free_port()
        conf = open(os.path.join(ROOT, "docker", "nginx.conf")).read()
        check("@UPSTREAM@" in conf and "@LISTEN@" in conf, "nginx.conf lost its placeholders")
        conf = conf.replace("@UPSTREAM@", "127.0.0.1:%d" % upstream_port)
        conf = conf.replace("@LISTEN@", "127.0.0.1:%d" % self.port)
        open(os.path.join(self.dir, "nginx.conf"), "w").write(conf)
        os.mkdir(os.path.join(self.dir, "tmp"))
        self.log_path = os.path.join(self.dir, "nginx.log")
        self.proc = subprocess.Popen([NGINX, "-p", self.dir + "/", "-c", "nginx.conf", "-e", "stderr"],
                                     stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail("nginx exited %d: %s" % (self.proc.returncode, self.log()))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        fail("nginx did not listen on %d: %s" % (self.port, self.log()))

    def log(self):
        try:
            return open(self.log_path).read()[-3000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: the workers finish, then exit
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Stream:
    """an event stream read one item at a time: ("event", (id, type, data)), ("comment", text),
    or ("end", None)"""

    def __init__(self, port, path, timeout, headers=None):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.c.request("GET", path, headers=dict({"Accept": "text/event-stream"}, **(headers or {})))
        self.r = self.c.getresponse()
        if self.r.status != 200:
            fail("events via %d: %d %s" % (port, self.r.status, self.r.read()[:300]))
        self.cur = {}

    def next(self):
        while True:
            try:
                line = self.r.readline()
            except socket.timeout:
                return ("timeout", None)
            if not line:
                return ("end", None)
            line = line.decode().rstrip("\n")
            if line.startswith(":"):
                return ("comment", line)
            if line == "":
                if "data" in self.cur:
                    cur, self.cur = self.cur, {}
                    return ("event", (int(cur["id"]), cur.get("event", "message"), json.loads(cur["data"])))
                continue
            k, _, v = line.partition(": ")
            self.cur[k] = v

    def close(self):
        self.c.close()


def access_line(s, rid):
    """ddpmd's access log entry (--log-format json) of the request with X-Request-Id rid"""
    for line in s.log().splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if isinstance(o, dict) and o.get("request_id") == rid and "status" in o:
            return o
    return None


def upload_streamed(s, port, announced, sent, timeout):
    """POST /ddpmd/train announcing a body of `announced` bytes and sending only `sent`: returns
    (ddpmd's access entry for it, the first line of the answer the client got) once ddpmd has
    answered, or (None, ...) when ddpmd saw nothing of it within timeout"""
    rid = "nginx-upload-%d" % os.getpid()
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c.sendall(("POST %s/train HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n" % (P, rid, announced)).encode())
    c.sendall(b" " * sent)
    entry = None
    deadline = time.time() + timeout
    while entry is None and time.time() < deadline:
        entry = access_line(s, rid)
        time.sleep(0.05)
    answer = b""
    try:
        while b"\r\n" not in answer:
            chunk = c.recv(4096)
            if not chunk:
                break
            answer += chunk
    except OSError:
        pass
    c.close()
    return entry, answer.split(b"\r\n")[0].decode(errors="replace")


def main(exe):
    need_fmnist()
    if not os.access(NGINX, os.X_OK):
        print("SKIP: no nginx (Debian package nginx)")
        sys.exit(77)
    s = Server(exe, args=["--path-prefix", P, "--sse-keepalive", "1", "--max-body", "4MiB",
                          "--log-format", "json"]).start()
    ng = Nginx(s.port)
    frozen = []
    try:
        run(s, ng, frozen)
    except BaseException:
        print("nginx log:\n" + ng.log())
        raise
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        ng.stop()
    print("ok: test_nginx")


def run(s, ng, frozen):
    direct = s.port
    s.via_port, s.prefix = ng.port, P
    check(s.request("GET", "/healthz").status == 200, "GET /ddpmd/healthz through nginx")
    c = http.client.HTTPConnection("127.0.0.1", ng.port, timeout=10)
    c.request("GET", P)
    r = c.getresponse()
    r.read()
    check(r.status == 301 and r.getheader("Location", "").endswith(P + "/"), "GET /ddpmd: %d %s" % (r.status, r.getheader("Location")))
    c.close()

    r = s.request("POST", "/train", tiny(steps=14, checkpoint_every=7))
    check(r.status == 202, "POST /ddpmd/train through nginx: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    check(r.header("Location") == P + "/jobs/" + jid, "Location through nginx: %s" % r.header("Location"))

    # the stream through nginx, until the job has made some progress; then freeze the job
    st = Stream(ng.port, P + "/jobs/%s/events" % jid, timeout=60)
    got = []
    while True:
        kind, ev = st.next()
        check(kind in ("event", "comment"), "the stream through nginx: %s before any progress (%s)" % (kind, got))
        if kind == "event":
            got.append(ev)
            if ev[1] == "progress" and ev[2].get("event") == "step" and ev[2]["step"] >= 2:
                break
    pids = job_processes(s.data)
    check(pids, "no job process to freeze")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)
    # what the server has logged by now: the direct stream up to its first keep-alive comment
    # (sent after 1 s without an event; the frozen job writes none)
    dst = Stream(direct, "/jobs/%s/events" % jid, timeout=60)
    logged = []
    while True:
        kind, ev = dst.next()
        check(kind in ("event", "comment"), "the direct stream: %s" % kind)
        if kind == "comment" and logged:
            break
        if kind == "event":
            logged.append(ev)
    dst.close()
    check(s.get_json("/jobs/" + jid)["state"] == "running", "the frozen job is not running")
    check(logged[-1][0] >= got[-1][0], "the direct stream is behind nginx's")
    check(logged[-1][2].get("step", 0) < 14, "the job logged its end before the freeze: %s" % logged[-1:])
    # every one of them must come through nginx now, while the job stays frozen (a buffering
    # proxy holds them until its buffer fills or the response ends)
    comments = 0
    deadline = time.time() + 30
    while got[-1][0] < logged[-1][0] and time.time() < deadline:
        kind, ev = st.next()
        if kind == "event":
            got.append(ev)
        elif kind == "comment":
            comments += 1
        else:
            break
    check(got[-1][0] == logged[-1][0], "nginx delivered events up to %d of the %d logged while the job was frozen"
          % (got[-1][0], logged[-1][0]))
    while comments == 0 and time.time() < deadline:  # a keep-alive comes through too
        kind, ev = st.next()
        check(kind != "event", "an event from a frozen job: %s" % (ev,))
        comments += kind == "comment"
    check(comments > 0, "no keep-alive comment through nginx")
    check(s.get_json("/jobs/" + jid)["state"] == "running", "the job ended while frozen")
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    del frozen[:]
    while True:
        kind, ev = st.next()
        if kind == "end":
            break
        check(kind != "timeout", "the stream through nginx stalled after the job went on")
        if kind == "event":
            got.append(ev)
    st.close()
    check([e[0] for e in got] == list(range(1, len(got) + 1)), "event ids through nginx: %s" % [e[0] for e in got])
    check(got[:len(logged)] == logged, "events through nginx differ from the server's")
    check([e[2]["state"] for e in got if e[1] == "state"][-1] == "succeeded", "the job did not succeed")
    ck = [e[2] for e in got if e[1] == "checkpoint"]
    check([c["id"] for c in ck] == [jid + "-7", jid + "-14"], "checkpoint events %s" % ck)

    # downloads through nginx are the server's bytes
    saved = s.prefix
    s.prefix = ""
    for c in ck:
        check(c["url"] == P + "/checkpoints/" + c["id"], "checkpoint url %s" % c)
        via = s.request("GET", c["url"])
        s.via_port = None
        own = s.request("GET", "/checkpoints/" + c["id"])
        s.via_port = ng.port
        check(via.status == 200 and own.status == 200 and via.body == own.body and len(via.body) > 1000,
              "checkpoint %s through nginx: %d, %d bytes vs %d" % (c["id"], via.status, len(via.body), len(own.body)))
        check(via.header("ETag") == own.header("ETag"), "ETag through nginx")
        rg = s.request("GET", c["url"], headers={"Range": "bytes=8-99"})
        check(rg.status == 206 and rg.body == own.body[8:100], "Range through nginx: %d" % rg.status)
    s.prefix = saved

    r = s.request("POST", "/samples", {"job": jid, "n": 2, "steps": 2, "batch": 2})
    check(r.status == 202, "POST /ddpmd/samples through nginx: %d %s" % (r.status, r.body[:300]))
    sid = r.json()["id"]
    check(r.header("Location") == P + "/samples/" + sid, "Location %s" % r.header("Location"))
    smp = wait_sample(s, sid)
    check(smp["state"] == "succeeded" and smp["links"]["grid"] == P + "/samples/%s.png" % sid, "sample %s" % smp)
    s.prefix = ""
    grid = s.request("GET", smp["links"]["grid"])
    s.via_port = None
    own = s.request("GET", "/samples/%s.png" % sid)
    s.via_port = ng.port
    s.prefix = P
    check(grid.status == 200 and grid.body == own.body and png_size(grid.body)[0] > 0, "the grid through nginx")

    # uploads: a 2 MiB body is ddpmd's to judge (nginx's own limit would answer 413 text/html)
    body = json.dumps({"data": {"dataset": "no-such"}}) + " " * (2 << 20)
    problem_ok(s.request("POST", "/train", body, headers={"Content-Type": "application/json"}), 422)
    # and a body is streamed: ddpmd refuses 64 MiB from the headers while the client has sent
    # only 64 KiB of it (a spooling proxy would pass nothing on until the body is whole). ddpmd
    # closes the connection after its early 413, which nginx reports to the client as 502.
    entry, first = upload_streamed(s, ng.port, 64 << 20, 64 << 10, timeout=20)
    check(entry is not None, "ddpmd saw nothing of a 64 MiB upload of which 64 KiB were sent: nginx spools it")
    check(entry["status"] == 413 and entry["path"] == "/train", "ddpmd's answer %s" % entry)
    check(first.startswith("HTTP/1.1 "), "no answer to the client before its body was complete: %r" % first)
    check(s.request("GET", "/healthz").status == 200, "healthy after")


if __name__ == "__main__":
    main(sys.argv[1])
