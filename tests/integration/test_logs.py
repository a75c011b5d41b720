"""test_logs.py - structured logs and request ids over a real socket. With --log-format json every
stderr line is one JSON object (time, level, msg); each request logs request_id, method, route
(the pattern), path, status, duration_ms and the job it made or named; every response echoes
X-Request-Id: a sane incoming one as is, otherwise a fresh one (distinct per request); a job's start and end are
lines that name it; libmicrohttpd's own messages (a header too large) are JSON lines too. With
--log-format text the lines are not JSON. Usage: test_logs.py PATH/TO/ddpmd
"""
import json
import re
import socket
import subprocess
import sys
import time

from serverlib import Server, check, need_fmnist, tiny


def lines_json(s):
    out = []
    for line in s.log().splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            check(False, "a log line that is not JSON: %r" % line[:200])
        check(isinstance(o, dict), "a log line that is not an object: %r" % line[:200])
        for k in ("time", "level", "msg"):
            check(k in o, "log line without %s: %s" % (k, o))
        check(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o["time"]), "time %r" % o["time"])
        check(o["level"] in ("info", "warn", "error"), "level %r" % o["level"])
        out.append(o)
    return out


def request_line(s, rid, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:  # the line is written when the request completes
        hits = [o for o in lines_json(s) if o.get("request_id") == rid]
        if hits:
            check(len(hits) == 1, "request %s logged %d times" % (rid, len(hits)))
            return hits[0]
        time.sleep(0.05)
    check(False, "no log line for request %s" % rid)


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--log-format", "json"]).start()
    # a sane incoming id is echoed and logged
    r = s.request("GET", "/healthz", headers={"X-Request-Id": "client-42.a:b_c"})
    check(r.header("X-Request-Id") == "client-42.a:b_c", "echo %r" % r.header("X-Request-Id"))
    o = request_line(s, "client-42.a:b_c")
    check(o["method"] == "GET" and o["route"] == "/healthz" and o["path"] == "/healthz" and
          o["status"] == 200, "healthz line %s" % o)
    check(isinstance(o["duration_ms"], (int, float)) and o["duration_ms"] >= 0, "duration %s" % o)
    # hostile or missing ids are replaced by fresh ones, each distinct
    seen = set()
    for bad in [None, "", "x" * 65, "has space", "new\\nline", "quote\"", "é"]:
        h = {} if bad is None else {"X-Request-Id": bad}
        r = s.request("GET", "/healthz", headers=h)
        rid = r.header("X-Request-Id")
        check(rid and re.match(r"^[0-9a-f]{16}$", rid), "generated id %r for %r" % (rid, bad))
        check(rid not in seen, "id %s given twice" % rid)
        seen.add(rid)
        request_line(s, rid)
    # errors carry the id too, and log their status and the route pattern with the job id
    r = s.request("GET", "/jobs/j0123456789abcdef", headers={"X-Request-Id": "e404"})
    check(r.status == 404 and r.header("X-Request-Id") == "e404", "404 %d %s" % (r.status, r.headers))
    o = request_line(s, "e404")
    check(o["status"] == 404 and o["route"] == "/jobs/{id}" and o["job"] == "j0123456789abcdef",
          "404 line %s" % o)
    r = s.request("GET", "/nope", headers={"X-Request-Id": "nope"})
    o = request_line(s, "nope")
    check(o["status"] == 404 and o["route"] is None and o["path"] == "/nope", "unmatched %s" % o)
    # a job: POST /train logs the job it made
    r = s.request("POST", "/train", tiny(steps=2), headers={"X-Request-Id": "train-1"})
    check(r.status == 202 and r.header("X-Request-Id") == "train-1", "POST /train %d" % r.status)
    jid = r.json()["id"]
    o = request_line(s, "train-1")
    check(o["status"] == 202 and o["route"] == "/train" and o["job"] == jid, "train line %s" % o)
    s.events(jid)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"GET /jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
    check(sock.recv(64).startswith(b"HTTP/1.1 431"), "a 40 KB header not refused with 431")
    sock.close()
    s.stop()
    # the job's own lines: running, then succeeded, each naming it
    mine = [o["msg"] for o in lines_json(s) if o.get("job") == jid and "request_id" not in o]
    check(len(mine) == 2 and mine[0].startswith("running on cpu (train job, 1 threads") and
          mine[1] == "succeeded", "the job's lines %s" % mine)
    msgs = [o["msg"] for o in lines_json(s)]
    check(any("loopback only" in m for m in msgs), "no start line in %s" % msgs[:3])
    check(msgs[-1] == "stopped", "last line %r" % msgs[-1])
    # libmicrohttpd's own message (a header over its memory limit: refused before any handler)
    # is a JSON line too (lines_json fails on any other)
    check(any(m.startswith("libmicrohttpd: ") and "431" in m and o["level"] == "warn"
              for o, m in ((o, o["msg"]) for o in lines_json(s))),
          "no libmicrohttpd line in %s" % msgs[-6:])

    # text: the readable lines, request id included
    t = Server(exe, args=["--log-format", "text"]).start()
    r = t.request("GET", "/healthz", headers={"X-Request-Id": "text-1"})
    check(r.header("X-Request-Id") == "text-1", "text echo")
    t.stop()
    log = t.log()
    check(re.search(r"GET /healthz 200 [0-9.]+ms request_id=text-1", log), "text line in %r" % log)
    check(log.startswith("ddpmd serve: "), "text start line %r" % log[:80])
    bad = Server(exe, args=["--log-format", "xml"])
    p = subprocess.run([exe, "serve", "--listen", "127.0.0.1:0", "--data", bad.data,
                        "--log-format", "xml"], capture_output=True, timeout=30)
    check(p.returncode == 2 and b"--log-format takes text or json" in p.stderr,
          "bad format: %d %s" % (p.returncode, p.stderr))
    print("test_logs: ok")


if __name__ == "__main__":
    main(sys.argv[1])
