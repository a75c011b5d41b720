"""test_hostile_text.py - text from a client cannot forge a log line or break an answer's UTF-8, a
POST /samples body follows POST /train's parser rules, and a bad token file stops the server at
start. A GET of /jobs/<id with %0A and a fake log line> leaves one log line; an id of multi-byte
characters, long enough to be cut, gets a 404 whose body is strict UTF-8 with no character split,
on every route that quotes an id, and an id of invalid UTF-8 bytes a body of strict UTF-8; POST
/samples with a duplicate key is a 422 naming it, one with 100,000 unknown fields a 422 of at most
16 errors in a small body, one with trailing bytes a 422; a token file with a secret over 255
characters or open to others is refused at start (exit 2, the line, the reason), and a good one
works. Usage: test_hostile_text.py PATH/TO/ddpmd
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse

from serverlib import Server, check

ALICE = "alice-secret-0123456789"
ERRORS_MAX = 16  # HTTP_ERRORS_MAX (api/http.h): POST /train's cap, on every route


def strict(body, what):
    try:
        text = body.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        check(False, "%s: the body is not valid UTF-8: %s: %r" % (what, e, body[:300]))
    return json.loads(text)


def test_log_forging(s):
    fake = "2026-01-01T00:00:00.000Z GET /jobs 200 0.100ms request_id=forged"
    path = "/jobs/x" + urllib.parse.quote("\n" + fake + "\r\n\x1b[2K", safe="/")
    r = s.request("GET", path, headers={"X-Request-Id": "forge-1"})
    check(r.status == 404, "forged path: %d %r" % (r.status, r.body[:200]))
    deadline = time.time() + 10
    while time.time() < deadline and "forge-1" not in s.log():
        time.sleep(0.05)
    lines = s.log().split("\n")
    mine = [ln for ln in lines if "request_id=forge-1" in ln]
    check(len(mine) == 1, "the request's log lines: %r" % mine)
    check(not any(ln.startswith("2026-01-01T00:00:00.000Z") or "request_id=forged" in ln
                  and "forge-1" not in ln for ln in lines),
          "a forged line in the log: %r" % [ln for ln in lines if "forged" in ln])
    check("\\x0a" in mine[0] and "\\x0d" in mine[0] and "\\x1b" in mine[0] and
          "\x1b" not in mine[0], "the control characters are not escaped: %r" % mine[0])


def test_cut_ids(s):
    # byte offsets chosen so a cut at 20, 40 or 100 bytes falls inside a character: "a" + n x "é"
    # (2 bytes) and n x "€" (3 bytes); the longest is past the 95-byte capture (no route, the
    # URL quoted)
    ids = ["a" + "\u00e9" * 30, "\u20ac" * 25, "a" + "\u00e9" * 60, "\U0001f600" * 11]
    routes = [("GET", "/jobs/%s"), ("POST", "/jobs/%s/cancel"), ("GET", "/jobs/%s/events"),
              ("GET", "/jobs/%s/checkpoints"), ("GET", "/jobs/%s/logs"),
              ("GET", "/jobs/%s/loss.csv"), ("GET", "/jobs/%s/loss.png"),
              ("GET", "/jobs/j0123456789abcdef/grids/%s.png"), ("GET", "/checkpoints/%s"),
              ("GET", "/samples/%s"), ("GET", "/samples/%s.png"),
              ("GET", "/samples/j0123456789abcdef/images/%s.png"), ("GET", "/datasets/%s"),
              ("GET", "/datasets/%s/preview.png"), ("DELETE", "/datasets/%s"),
              ("PUT", "/jobs/%s")]
    for method, pattern in routes:
        for i in ids:
            what = "%s %s with a %d-byte id" % (method, pattern, len(i.encode()))
            r = s.request(method, pattern % urllib.parse.quote(i))
            check(r.status in (404, 405), "%s: %d %r" % (what, r.status, r.body[:200]))
            o = strict(r.body, what)
            check("\ufffd" not in o["detail"], "%s: a character split: %r" % (what, o["detail"]))
        # bytes that are no UTF-8 at all (a lone lead byte, 0xff, a surrogate) are replaced
        for b in [b"\xc3", b"a\xff\xfeb", b"\xed\xa0\x80" * 3, b"\xe2\x82" * 40]:
            what = "%s %s with id %r" % (method, pattern, b[:12])
            r = s.request(method, pattern % urllib.parse.quote(b))
            check(r.status in (404, 405), "%s: %d %r" % (what, r.status, r.body[:200]))
            strict(r.body, what)


def test_samples_body(s):
    body = b'{"job": "j0123456789abcdef", "n": 1, "n": 1024}'
    r = s.request("POST", "/samples", body, headers={"Content-Type": "application/json"})
    check(r.status == 422, "duplicate key: %d %r" % (r.status, r.body[:300]))
    errs = r.json()["errors"]
    check(any(e["path"] == "n" and "duplicate" in e["message"] for e in errs),
          "duplicate key not named: %r" % errs)
    body = ("{" + ",".join('"%d":0' % k for k in range(100000)) + "}").encode()
    check(len(body) < 1 << 20, "the body is %d bytes, over the default --max-body" % len(body))
    r = s.request("POST", "/samples", body, headers={"Content-Type": "application/json"})
    check(r.status == 422, "100,000 unknown fields: %d %r" % (r.status, r.body[:300]))
    o = strict(r.body, "100,000 unknown fields")
    check(1 <= len(o["errors"]) <= ERRORS_MAX and o["errors"][0]["path"] == "0" and
          "unknown field" in o["errors"][0]["message"], "the errors: %r" % o["errors"][:3])
    check(len(r.body) < 4096, "a %d-byte answer to 100,000 unknown fields" % len(r.body))
    check("at least %d errors" % ERRORS_MAX in o["detail"], "detail %r" % o["detail"])
    # trailing bytes, as POST /train refuses them
    r = s.request("POST", "/samples", b'{"job": "j0123456789abcdef"} {}',
                  headers={"Content-Type": "application/json"})
    check(r.status == 422 and "trailing" in r.json()["errors"][0]["message"],
          "trailing bytes: %d %r" % (r.status, r.body[:300]))


def refused(exe, d, tokfile, want):
    p = subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0", "--data", d, "--token-file",
                          tokfile], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # it started: the file was accepted
        p.kill()
        p.communicate()
        check(False, "token file %s: the server started (want %r)" % (tokfile, want))
    err = err.decode("utf-8", "replace")
    check(p.returncode == 2 and all(w in err for w in want),
          "token file %s: exit %d, want %r in %r" % (tokfile, p.returncode, want, err[-400:]))


def test_token_file(exe):
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    tf = os.path.join(d, "tokens")
    # the trial's file: a 255-character secret, then "admin" on the same word
    with open(tf, "w") as f:
        f.write("alice %s\neve %sadmin\n" % (ALICE, "X" * 255))
    os.chmod(tf, 0o600)
    refused(exe, d, tf, [tf + ":2:", "secret of eve is longer than 255 characters"])
    # a good file others can read
    with open(tf, "w") as f:
        f.write("alice %s admin\n" % ALICE)
    os.chmod(tf, 0o644)
    refused(exe, d, tf, [tf, "open to group or others", "0644", "chmod 600"])
    # the same file, private: works
    os.chmod(tf, 0o600)
    s = Server(exe, data=d, args=["--token-file", tf])
    s.own_data = True
    s.start()
    r = s.request("GET", "/jobs", token=ALICE)
    check(r.status == 200, "alice with a good token file: %d %r" % (r.status, r.body[:200]))
    r = s.request("GET", "/jobs", token="X" * 255)
    check(r.status == 401, "eve's cut secret: %d" % r.status)
    s.stop()


def main(exe):
    s = Server(exe).start()
    test_log_forging(s)
    test_cut_ids(s)
    test_samples_body(s)
    s.stop()
    test_token_file(exe)
    print("OK test_hostile_text")


if __name__ == "__main__":
    main(sys.argv[1])
