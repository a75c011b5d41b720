"""test_bad_inputs.py - a table of bad requests against a server with bearer tokens: each gets its
exact status and an RFC 9457 problem+json body (with the field path for validation errors); the
server is healthy after and stored nothing for them; owners see only their own jobs. Specs whose
work is out of bounds by their numbers alone (a 1024 px, 8-level spec at batch 65535; attention
at a resolution no level has; a decoded dataset larger than the host's memory) are 422 with the
reason before anything is planned. Also: no tokens on a non-loopback address is refused at start. Usage: test_bad_inputs.py PATH/TO/ddpmd
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile

from serverlib import Server, check, need_fmnist, problem_ok, tiny

ALICE, BOB, ROOT = "alice-secret-0123456789", "bob-secret-0123456789ab", "root-secret-0123456789ab"


def raw(s, method, path, body, headers):
    """a request with exactly these headers (no defaults added)"""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    c.putrequest(method, path, skip_accept_encoding=True)
    body = body.encode() if isinstance(body, str) else body
    for k, v in headers.items():
        c.putheader(k, v)
    if body or method == "POST":
        c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    from serverlib import Response
    out = Response(r.status, r.getheaders(), r.read())
    c.close()
    return out


def main(exe):
    need_fmnist()
    # without tokens only loopback: refused at start, and says why
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    p = subprocess.run([exe, "serve", "--listen", "0.0.0.0:0", "--data", d], capture_output=True,
                       timeout=60)
    check(p.returncode == 2 and b"loopback" in p.stderr, "non-loopback without tokens: %d %s"
          % (p.returncode, p.stderr))

    tokfile = os.path.join(d, "tokens")
    with open(tokfile, "w") as f:
        f.write("# name secret [admin]\nalice %s\nbob %s\nroot %s admin\n" % (ALICE, BOB, ROOT))
    os.chmod(tokfile, 0o600)  # a token file must be private (api_tokens_load)
    # the body limit from the environment (every option has its DDPMD_* variable)
    s = Server(exe, data=d, args=["--token-file", tokfile], env={"DDPMD_MAX_BODY": "4096"})
    s.own_data = True  # the folder is removed at exit
    s.start()
    s.token = ALICE

    # one real job of alice's (long, so it is still there to be looked at; canceled at the end)
    r = s.request("POST", "/train", tiny(steps=100000, checkpoint_every=0))
    check(r.status == 202, "alice's job: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]

    good = json.dumps(tiny())
    J = {"Content-Type": "application/json", "Authorization": "Bearer " + ALICE}
    big = json.dumps(dict(tiny(), pad="x" * 5000))

    def spec(**edit):
        t = tiny()
        for k, v in edit.items():
            sect, _, key = k.partition("__")
            if key:
                t[sect][key] = v
            else:
                t[sect] = v
        return json.dumps(t)

    # out of bounds by its numbers: once planned for 13 s and 3.2 GB on the HTTP thread
    heavy = tiny(batch=65535)
    heavy["model"].update(image_size=1024, block_out_channels=[64, 64, 128, 128, 256, 256, 512, 512],
                          layers_per_block=2, attention_resolutions=[16], norm_num_groups=32)
    heavy["data"]["fmnist_resize"] = "resize"
    no_level = tiny()
    no_level["model"]["attention_resolutions"] = [1000000]
    huge_data = tiny()
    huge_data["model"].update(image_size=1024, block_out_channels=[32, 32, 64, 64, 64, 64, 64, 64],
                              attention_resolutions=[16])
    huge_data["data"]["fmnist_resize"] = "resize"
    # Fashion-MNIST is held as its 28x28 bytes at any size; 2,000 images of 1024 px in the
    # loader's two batches and the step's four buffers are ~47 GiB (under the 64 GiB batch bound)
    huge_data.setdefault("train", {})["batch"] = 2000
    need = 60000 * (28 * 28 + 1 + 4) + 6 * 2000 * 1024 * 1024 * 4
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    table = [
        # (what, method, path, body, headers, status, field path)
        ("no token", "POST", "/train", good, {"Content-Type": "application/json"}, 401, None),
        ("bad token", "POST", "/train", good, dict(J, Authorization="Bearer nope-nope-nope-nope"), 401, None),
        ("not bearer", "GET", "/jobs", "", {"Authorization": "Basic YTpi"}, 401, None),
        ("token prefix", "GET", "/jobs", "", {"Authorization": "Bearer " + ALICE[:-1]}, 401, None),
        ("token plus a byte", "GET", "/jobs", "", {"Authorization": "Bearer " + ALICE + "x"}, 401, None),
        ("empty token", "GET", "/jobs", "", {"Authorization": "Bearer "}, 401, None),
        ("malformed JSON", "POST", "/train", '{"model": ', J, 400, None),
        ("not JSON at all", "POST", "/train", "hello", J, 400, None),
        ("no content type", "POST", "/train", good, {"Authorization": "Bearer " + ALICE}, 415, None),
        ("form content type", "POST", "/train", good, dict(J, **{"Content-Type": "text/plain"}), 415, None),
        ("wrong type", "POST", "/train", spec(train__batch="8"), J, 422, "train.batch"),
        ("wrong type 2", "POST", "/train", spec(model=[1, 2]), J, 422, "model"),
        ("unknown field", "POST", "/train", spec(train__bogus=1), J, 422, "train.bogus"),
        ("unknown top field", "POST", "/train", spec(extra={}), J, 422, "extra"),
        ("huge number", "POST", "/train", spec(train__steps=1e30), J, 422, "train.steps"),
        ("negative", "POST", "/train", spec(train__batch=-1), J, 422, "train.batch"),
        ("array body", "POST", "/train", "[]", J, 422, ""),
        ("path as dataset", "POST", "/train", spec(data={"dataset": "/etc"}), J, 422, "data.dataset"),
        ("relative path as dataset", "POST", "/train", spec(data={"dataset": "../jobs"}), J, 422, "data.dataset"),
        ("path as init_from", "POST", "/train", json.dumps(dict(tiny(), init_from="/etc/passwd")), J, 422, "init_from"),
        ("unknown checkpoint", "POST", "/train", json.dumps(dict(tiny(), init_from="j0000000000000000-3")), J, 422, "init_from"),
        ("oversized (length)", "POST", "/train", big, J, 413, None),
        ("heavy spec", "POST", "/train", json.dumps(heavy), J, 422, "train.batch"),
        ("attention at no level", "POST", "/train", json.dumps(no_level), J, 422,
         "model.attention_resolutions[0]"),
        ("unknown job", "GET", "/jobs/j0123456789abcdef", "", J, 404, None),
        ("bad job id", "GET", "/jobs/..%2f..%2fetc", "", J, 404, None),
        ("path-like job id", "GET", "/jobs/../ddpmd.db", "", J, 404, None),
        ("unknown job cancel", "POST", "/jobs/j0123456789abcdef/cancel", "", J, 404, None),
        ("unknown job events", "GET", "/jobs/j0123456789abcdef/events", "", J, 404, None),
        ("unknown checkpoint id", "GET", "/checkpoints/j0123456789abcdef-1", "", J, 404, None),
        ("bad checkpoint id", "GET", "/checkpoints/..%2fddpmd.db", "", J, 404, None),
        ("no checkpoint yet", "GET", "/checkpoints/%s-7" % jid, "", J, 404, None),
        ("unknown route", "GET", "/nope", "", J, 404, None),
        ("trailing slash", "GET", "/jobs/", "", J, 404, None),
        ("wrong method", "DELETE", "/jobs", "", J, 405, None),
        ("wrong method 2", "GET", "/train", "", J, 405, None),
        ("bad state filter", "GET", "/jobs?state=bogus", "", J, 400, "state"),
        ("bad limit", "GET", "/jobs?limit=0", "", J, 400, "limit"),
        ("bad after", "GET", "/jobs?after=../x", "", J, 400, "after"),
        ("bad Last-Event-ID", "GET", "/jobs/%s/events" % jid, "", dict(J, **{"Last-Event-ID": "x"}), 400, "Last-Event-ID"),
        ("other owner's job", "GET", "/jobs/" + jid, "", dict(J, Authorization="Bearer " + BOB), 403, None),
        ("other owner's cancel", "POST", "/jobs/%s/cancel" % jid, "", dict(J, Authorization="Bearer " + BOB), 403, None),
        ("other owner's events", "GET", "/jobs/%s/events" % jid, "", dict(J, Authorization="Bearer " + BOB), 403, None),
        ("other owner's checkpoints", "GET", "/jobs/%s/checkpoints" % jid, "", dict(J, Authorization="Bearer " + BOB), 403, None),
    ]
    if host < need:  # a host with more memory than ~47 GiB takes the batches
        table.append(("dataset over the host's memory", "POST", "/train", json.dumps(huge_data), J,
                      422, "data.dataset"))
    for what, method, path, body, headers, status, field in table:
        r = raw(s, method, path, body, headers)
        try:
            p = problem_ok(r, status, field)
        except AssertionError:
            print("  case: %s" % what)
            raise
        if status == 401:
            check((r.header("WWW-Authenticate") or "").startswith("Bearer"), "%s: WWW-Authenticate" % what)
        if status == 405:
            check(r.header("Allow"), "%s: no Allow header" % what)
        if field == "data.dataset" and "memory" in what:
            check("bytes" in p["detail"] and "memory" in p["detail"], "%s: %s" % (what, p["detail"]))
        elif field == "data.dataset":
            check("path" in p["detail"], "%s: %s" % (what, p["detail"]))
        if what == "heavy spec":
            check("bytes" in p["detail"], "%s: %s" % (what, p["detail"]))
        if what == "attention at no level":
            check("matches no level" in p["detail"], "%s: %s" % (what, p["detail"]))

    # a chunked body over the limit (no Content-Length to refuse it by)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    c.request("POST", "/train", body=iter([big[:3000].encode(), big[3000:].encode()]),
              headers=dict(J), encode_chunked=True)
    r = c.getresponse()
    check(r.status == 413, "chunked oversized body: %d" % r.status)
    c.close()

    # healthy after, and only alice's one job stored
    check(s.get_json("/healthz")["status"] == "ok", "healthz after")
    check([j["id"] for j in s.get_json("/jobs", token=ROOT)["jobs"]] == [jid], "stored jobs")
    check(s.get_json("/jobs", token=BOB)["jobs"] == [], "bob sees alice's job")
    check(s.get_json("/jobs/" + jid, token=ROOT)["owner"] == "alice", "admin sees it")
    check(sorted(os.listdir(os.path.join(d, "jobs"))) == [jid], "job folders %s" % os.listdir(os.path.join(d, "jobs")))
    r = s.request("POST", "/jobs/%s/cancel" % jid)
    check(r.status in (200, 202), "cancel alice's job: %d" % r.status)
    s.wait_job(jid, lambda j: j["state"] == "canceled", what="canceled")
    check(s.stop() == 0, "server exit status")
    print("test_bad_inputs: ok")


if __name__ == "__main__":
    main(sys.argv[1])
