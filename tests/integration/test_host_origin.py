"""test_host_origin.py - DNS rebinding (issue 23, item 7): without tokens the server answers only
requests that name the loopback (Host localhost / 127.0.0.0/8 / [::1], any port; an Origin, when
sent, one of those): a page of evil.example.com whose name resolves to 127.0.0.1 is refused 403
problem+json. With tokens the token decides, whatever the Host.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, problem_ok  # noqa: E402

TOKEN = "host-origin-test-token-0123456789"

REFUSED = [
    {"Host": "evil.example.com"},
    {"Host": "evil.example.com:8080"},
    {"Host": "127.0.0.1.evil.example.com"},
    {"Host": "localhost.evil.example.com"},
    {"Host": "127.0.0.1:80:80"},
    {"Host": "[::1]x"},
    {"Host": "0x7f.0.0.1"},
    {"Host": "127.0.0.1", "Origin": "http://evil.example.com"},
    {"Host": "localhost", "Origin": "http://evil.example.com:8080"},
    {"Host": "localhost", "Origin": "null"},
    {"Host": "localhost", "Origin": "http://localhost.evil.example.com"},
    {"Host": "localhost", "Origin": "ftp://localhost"},
]
ACCEPTED = [
    {"Host": "localhost"},
    {"Host": "LocalHost:8080"},
    {"Host": "127.0.0.1"},
    {"Host": "127.0.0.1:65535"},
    {"Host": "127.1.2.3:99"},
    {"Host": "[::1]"},
    {"Host": "[::1]:8080"},
    {"Host": "127.0.0.1:8080", "Origin": "http://127.0.0.1:8080"},
    {"Host": "localhost:1", "Origin": "http://localhost:8080"},
    {"Host": "[::1]:1", "Origin": "https://[::1]"},
]


def status(s, path, headers, method="GET", body=None):
    r = s.request(method, path, headers=headers, body=body)
    return r


def main(exe):
    s = Server(exe).start()
    for path in ("/healthz", "/jobs", "/devices"):
        for h in REFUSED:
            r = status(s, path, h)
            p = problem_ok(r, 403)
            check(p["type"] == "urn:ddpmd:problem:not-loopback", "type %s" % p)
            check("loopback" in p["detail"], "detail %s" % p)
        for h in ACCEPTED:
            r = status(s, path, h)
            check(r.status == 200, "%s %s: %d %s" % (path, h, r.status, r.body[:200]))
    # a write is refused before its body is read (a page could POST /train as the admin)
    r = status(s, "/train", {"Host": "evil.example.com", "Content-Type": "application/json"},
               method="POST", body="{}")
    problem_ok(r, 403)
    r = status(s, "/jobs/0123456789abcdef/cancel", {"Origin": "http://evil.example.com"},
               method="POST")
    problem_ok(r, 403)
    s.stop()

    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    tok = os.path.join(d, "tokens")
    fd = os.open(tok, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, ("alice %s admin\n" % TOKEN).encode())
    os.close(fd)
    t = Server(exe, data=d, args=["--token-file", tok])
    t.own_data = True
    t.start()
    t.token = TOKEN
    for h in REFUSED + ACCEPTED:
        for path in ("/healthz", "/jobs"):
            r = status(t, path, h)
            check(r.status == 200, "tokens: %s %s: %d %s" % (path, h, r.status, r.body[:200]))
    r = t.request("GET", "/jobs", headers={"Host": "evil.example.com"}, token="")
    check(r.status == 401, "tokens, no token: %d" % r.status)
    t.stop()
    print("ok: %d refused and %d accepted Host/Origin pairs without tokens; all with a token"
          % (len(REFUSED), len(ACCEPTED)))


if __name__ == "__main__":
    main(sys.argv[1])
