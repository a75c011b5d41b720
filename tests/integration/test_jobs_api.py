"""test_jobs_api.py - the job API's own routes over a real socket: a job's name and labels
(validated under the spec's 16-error cap, shown, filtered on GET /jobs, kept across a restart),
DELETE /jobs/{id} (409 while queued or running or while another job reads its checkpoint, its
files gone after, 404 then), importing a checkpoint (POST /checkpoints: kept as a job of kind
import, sampled from, used as init_from; a file that matches no model refused with the reason;
owner-only), resuming a canceled job (POST /jobs/{id}/resume: 409 otherwise, 409 without a
checkpoint; it ends with the weights of an uninterrupted run, bit for bit), the job answer's
shape (one full plan, a compact spec, complete links), /healthz's auth_required, and that the
server and openapi.yaml's schemas agree at the bounds of name, labels, after, limit and
Idempotency-Key.
Usage: test_jobs_api.py PATH/TO/ddpmd
"""
import json
import os
import re
import struct
import subprocess
import sys

import jsonschema

from serverlib import OPENAPI, Server, check, need_fmnist, problem_ok, tiny, validate
from test_restart_exact import tensors

STEPS = 8
OCTET = {"Content-Type": "application/octet-stream"}


def safetensors_bytes(tens, meta):
    """{name: (dtype, shape, raw)}, metadata -> safetensors bytes"""
    head, off, blobs = {"__metadata__": meta} if meta else {}, 0, []
    for name, (dt, shape, raw) in sorted(tens.items()):
        head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def schema_bounds(s, spec):
    """the server refuses exactly what openapi.yaml's schemas refuse, at their bounds: a job's
    name and labels, the `after` cursor, `limit`, Idempotency-Key"""
    sch, par = OPENAPI["components"]["schemas"], OPENAPI["components"]["parameters"]
    name, lab = sch["JobName"], sch["JobLabels"]
    kmax, vmax = lab["propertyNames"]["maxLength"], lab["additionalProperties"]["maxLength"]

    def train_errors(**extra):
        body = dict(spec, **extra)
        body["train"] = dict(spec["train"], batch=0)  # refused in any case: nothing is queued
        return [e["path"] for e in s.request("POST", "/train", body).json().get("errors", [])]
    cases = [({"name": "n" * name["maxLength"]}, True), ({"name": "n" * (name["maxLength"] + 1)}, False),
             ({"labels": {"k%d" % i: "v" for i in range(lab["maxProperties"])}}, True),
             ({"labels": {"k%d" % i: "v" for i in range(lab["maxProperties"] + 1)}}, False),
             ({"labels": {"k" * kmax: "v" * vmax}}, True), ({"labels": {"k" * (kmax + 1): "v"}}, False),
             ({"labels": {"k": "v" * (vmax + 1)}}, False)]
    for extra, ok in cases:
        check(jsonschema.Draft202012Validator(dict(sch["TrainRequest"], components=OPENAPI["components"]))
              .is_valid(dict(spec, **extra)) == ok, "the schema on %s" % str(extra)[:80])
        errs = [p for p in train_errors(**extra) if p != "train.batch"]
        check((errs == []) == ok, "the server on %s: %s" % (str(extra)[:80], errs))
    # every integer of the spec: its schema's bounds are the server's
    props = sch["TrainSpec"]["properties"]
    n = 0
    for group in ("data", "diffusion", "train", "output"):
        for field, f in props[group]["properties"].items():
            if f.get("type") != "integer":
                continue
            for v, ok in [(f["minimum"], True), (f["maximum"], True), (f["minimum"] - 1, False),
                          (f["maximum"] + 1, False)]:
                body = json.loads(json.dumps(spec))
                body.setdefault(group, {})[field] = v
                errs = s.request("POST", "/train", dict(body, name=1)).json().get("errors", [])
                bound = [e for e in errs if e["path"] == group + "." + field and
                         ("must be" in e["message"] or "at most" in e["message"])]
                check((not bound) == ok, "%s.%s = %d: the schema says %s, the server %s" %
                      (group, field, v, "valid" if ok else "invalid", bound))
                n += 1
    check(n >= 48, "only %d spec bounds checked" % n)
    after = par["After"]["schema"]["pattern"]
    for v in ["j0123456789abcdef", "j0123456789abcde", "x"]:
        r = s.request("GET", "/jobs?after=" + v)
        # a well-formed id of no job is a 400 of its own (no such job), not the format's
        formed = r.status == 200 or (r.status == 400 and b"no such job" in r.body)
        check(formed == bool(re.match(after, v)), "after=%s: %d %s" % (v, r.status, r.body[:200]))
    lim = par["Limit"]["schema"]
    for v, ok in [(lim["minimum"], True), (lim["maximum"], True), (lim["minimum"] - 1, False),
                  (lim["maximum"] + 1, False)]:
        check((s.request("GET", "/jobs?limit=%d" % v).status == 200) == ok, "limit=%d" % v)
    key = par["IdempotencyKey"]["schema"]
    for v in ["k" * key["maxLength"], "k" * (key["maxLength"] + 1), "a b", "~!"]:
        ok = len(v) <= key["maxLength"] and bool(re.match(key["pattern"], v))
        got = s.request("POST", "/train", dict(spec, train=dict(spec["train"], batch=0)),
                        headers={"Idempotency-Key": v}).status
        check(got == (422 if ok else 400), "Idempotency-Key %r: %d" % (v[:10], got))


def main(exe):
    need_fmnist()
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddpmd-jobs-api-%d" % os.getpid())
    os.makedirs(tmp)
    release = os.path.join(tmp, "release")
    # a training job holds after step 3 until the release file appears (server/testhold.h), so
    # the cancel comes mid-run however fast the machine
    env = {"DDPMD_TEST_HOLD_STEP": "3", "DDPMD_TEST_HOLD_FILE": release}
    s = Server(exe, env=env).start()
    data = s.data
    h = s.get_json("/healthz")
    check(h == {"status": "ok", "auth_required": False}, "healthz without tokens: %s" % h)

    spec = tiny(steps=STEPS, checkpoint_every=2, keep_last=2, seed=7)
    spec["model"].update(block_out_channels=[16, 32], attention_resolutions=[16], dropout=0.1)
    spec["data"]["flip"] = True

    # name and labels: refused with the spec's errors under one cap, then kept
    bad = dict(spec, name="-x", labels={"": "a", "k": 3, "ok": "a b"})
    bad["train"] = dict(spec["train"], batch=0)
    p = problem_ok(s.request("POST", "/train", bad), 422)
    paths = [e["path"] for e in p["errors"]]
    check(paths == ["name", "labels.", "labels.k", "labels.ok", "train.batch"], "errors %s" % paths)
    many = dict(spec, labels={"k%d" % i: "v" for i in range(17)}, name="n" * 65)
    paths = [e["path"] for e in problem_ok(s.request("POST", "/train", many), 422)["errors"]]
    check(paths == ["name", "labels"], "17 labels and a 65-byte name: %s" % paths)
    flood = dict(spec, labels={"k%d" % i: 1 for i in range(16)}, name=1)
    p = problem_ok(s.request("POST", "/train", flood), 422)
    check(len(p["errors"]) == 16, "the error cap: %d errors" % len(p["errors"]))
    check(s.get_json("/jobs")["jobs"] == [], "a refused job was stored")

    r = s.request("POST", "/train", dict(spec, name="resume-me", labels={"team": "vision",
                                                                        "exp": "a/b:1"}))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    job = r.json()
    validate(job, "Job")
    jid = job["id"]
    check(job["name"] == "resume-me" and job["labels"] == {"team": "vision", "exp": "a/b:1"},
          "name and labels %s %s" % (job["name"], job["labels"]))
    # the answer: one full plan, brief plans, the spec without whitespace, every link
    raw = r.body.decode()
    check(raw.count('"search"') == 1 and raw.count('"parts"') == 1,
          "the plan is shown %d times" % raw.count('"search"'))
    check("\t" not in raw and "\n" not in raw, "the spec is indented")
    links = job["links"]
    for k, tail in [("self", ""), ("events", "/events"), ("logs", "/logs"),
                    ("loss_png", "/loss.png"), ("loss_csv", "/loss.csv"),
                    ("grids", "/grids/{step}.png"), ("checkpoints", "/checkpoints")]:
        check(links.get(k) == "/jobs/%s%s" % (jid, tail), "links.%s: %s" % (k, links.get(k)))

    # delete and resume while it runs: 409
    s.wait_job(jid, lambda j: j["step"] >= 3, what="step 3 (held)")
    problem_ok(s.request("DELETE", "/jobs/" + jid), 409)
    problem_ok(s.request("POST", "/jobs/%s/resume" % jid), 409)
    r = s.request("POST", "/jobs/%s/cancel" % jid)
    check(r.status == 202, "cancel: %d" % r.status)
    j = s.wait_job(jid, lambda j: j["state"] == "canceled", what="canceled")
    open(release, "w").close()  # later starts run through
    check(j["links"]["checkpoint"] == "/checkpoints/%s-3" % jid and
          j["links"]["export"] == "/checkpoints/%s-3?format=diffusers" % jid,
          "links to the newest checkpoint %s" % j["links"])

    # filters, and a restart keeps name and labels
    for q, want in [("name=resume-me", [jid]), ("name=other", []), ("label=team:vision", [jid]),
                    ("label=exp:a/b:1", [jid]), ("label=team:x", []), ("label=x:vision", []),
                    # several: every one (AND), whichever comes first
                    ("label=team:vision&label=exp:a/b:1", [jid]),
                    ("label=team:vision&label=exp:x", []), ("label=exp:x&label=team:vision", []),
                    ("name=resume-me&label=team:vision&label=team:vision", [jid])]:
        got = [x["id"] for x in s.get_json("/jobs?" + q)["jobs"]]
        check(got == want, "GET /jobs?%s: %s" % (q, got))
    for q in ["name=-x", "label=novalue", "label=:v", "name=" + "n" * 65,
              "label=team:vision&label=bad", "&".join("label=k%d:v" % i for i in range(17))]:
        problem_ok(s.request("GET", "/jobs?" + q), 400)
    schema_bounds(s, spec)
    check(s.stop() == 0, "stop")
    s = Server(exe, data=data, env=env).start()
    s.own_data = True
    got = [x["id"] for x in s.get_json("/jobs?label=team:vision&name=resume-me")["jobs"]]
    check(got == [jid], "after a restart: %s" % got)

    # resume: from the checkpoint at step 3 to the end, as if never stopped
    r = s.request("POST", "/jobs/%s/resume" % jid)
    check(r.status == 202 and r.json()["state"] in ("queued", "running") and
          r.header("Location") == "/jobs/" + jid, "resume: %d %s" % (r.status, r.body[:300]))
    evs, _ = s.events(jid, timeout=180)
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded" and j["step"] == STEPS and not j["cancel_requested"] and
          j["name"] == "resume-me", "resumed job %s" % {k: j[k] for k in ("state", "step", "name")})
    running = [e[2] for e in evs if e[1] == "state" and e[2]["state"] == "running"]
    check([x.get("resumed_from_step", 0) for x in running] == [0, 3], "starts %s" % running)
    got, _ = tensors(s.request("GET", "/checkpoints/%s-%d" % (jid, STEPS)).body)
    ref = os.path.join(tmp, "reference")
    p = subprocess.run([exe, "train", os.path.join(s.data, "jobs", jid, "spec.json"), "--out", ref],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    check(p.returncode == 0, "the reference run: %s" % p.stderr[-400:])
    ref_blob = open(os.path.join(ref, "checkpoints", "step-%08d.safetensors" % STEPS), "rb").read()
    want, _ = tensors(ref_blob)
    diff = [n for n in want if got.get(n) != want[n]]
    check(sorted(got) == sorted(want) and not diff, "%d tensors differ from the uninterrupted run"
          % len(diff))
    problem_ok(s.request("POST", "/jobs/%s/resume" % jid), 409)  # succeeded

    # a job canceled while queued has no checkpoint: 409
    big = tiny(steps=100000)
    q1 = s.request("POST", "/train", dict(big, name="first")).json()["id"]
    q2 = s.request("POST", "/train", big).json()["id"]
    s.request("POST", "/jobs/%s/cancel" % q2)
    s.request("POST", "/jobs/%s/cancel" % q1)
    s.wait_job(q2, lambda j: j["state"] == "canceled", what="q2 canceled")
    p = problem_ok(s.request("POST", "/jobs/%s/resume" % q2), 409)
    check(p["type"].endswith("no-checkpoint"), "no checkpoint: %s" % p)

    # import: the job's checkpoint uploaded again, sampled from and used as init_from
    blob = s.request("GET", "/checkpoints/%s-%d" % (jid, STEPS)).body
    problem_ok(s.request("POST", "/checkpoints", b"x", headers={"Content-Type": "text/plain"}), 415)
    r = s.request("POST", "/checkpoints?name=imported", blob, headers=OCTET)
    check(r.status == 201, "import: %d %s" % (r.status, r.body[:300]))
    imp = r.json()
    validate(imp, "Job")
    check(imp["kind"] == "import" and imp["state"] == "succeeded" and imp["name"] == "imported" and
          r.header("Location") == "/checkpoints/%s-%d" % (imp["id"], STEPS), "import %s" % imp)
    check(s.request("GET", r.header("Location")).body == blob, "the imported bytes differ")
    r = s.request("POST", "/samples", {"checkpoint": "%s-%d" % (imp["id"], STEPS), "n": 2,
                                       "steps": 2})
    check(r.status == 202, "sample from the import: %d %s" % (r.status, r.body[:300]))
    sid = r.json()["id"]
    problem_ok(s.request("DELETE", "/jobs/" + imp["id"]), 409)  # the sampling job reads it
    init = dict(tiny(steps=2), init_from="%s-%d" % (imp["id"], STEPS))
    init["model"] = spec["model"]
    r = s.request("POST", "/train", init)
    check(r.status == 202, "init_from the import: %d %s" % (r.status, r.body[:300]))
    fine = r.json()["id"]
    s.wait_job(sid, lambda j: j["state"] == "succeeded", what="the sample", timeout=180)
    s.wait_job(fine, lambda j: j["state"] == "succeeded", what="the fine-tune", timeout=180)
    # refused: not safetensors; a state_dict without a model; one whose shapes match no model
    p = problem_ok(s.request("POST", "/checkpoints", b"\x10" + b"\0" * 7 + b"{}", headers=OCTET), 422)
    check("safetensors" in p["detail"] and s.data not in p["detail"], "garbage: %s" % p["detail"])
    sd = {n: t for n, t in want.items() if not n.startswith(("ema.", "adam_"))}
    p = problem_ok(s.request("POST", "/checkpoints", safetensors_bytes(sd, None), headers=OCTET), 422)
    check("preset" in p["detail"] or p["errors"][0]["path"] == "preset", "no spec: %s" % p)
    p = problem_ok(s.request("POST", "/checkpoints?preset=ddpm&image_size=32&in_channels=1",
                             safetensors_bytes(sd, None), headers=OCTET), 422)
    check(p["type"].endswith("checkpoint-mismatch") and "tensor '" in p["detail"],
          "a ddpm-cifar10 shape for the tiny weights: %s" % p["detail"])
    ck, meta = tensors(blob)
    name = "conv_in.weight"
    dt, shape, raw = ck[name]
    ck[name] = (dt, (shape[0] // 2, shape[1] * 2) + tuple(shape[2:]), raw)
    p = problem_ok(s.request("POST", "/checkpoints", safetensors_bytes(ck, meta), headers=OCTET), 422)
    check(p["type"].endswith("checkpoint-mismatch") and name in p["detail"], "misshapen: %s" % p["detail"])
    check(len(s.get_json("/jobs?kind=import")["jobs"]) == 1, "a refused import was kept")

    # delete: an ended job and every file of it; 404 after
    s.wait_job(q1, lambda j: j["state"] == "canceled", what="q1 canceled")
    for victim in (jid, imp["id"], q1):
        folder = os.path.join(s.data, "jobs", victim)
        check(os.path.isdir(folder), "no folder %s" % folder)
        r = s.request("DELETE", "/jobs/" + victim)
        check(r.status == 204 and r.body == b"", "DELETE: %d %s" % (r.status, r.body[:200]))
        check(not os.path.exists(folder), "%s is still on disk" % folder)
        problem_ok(s.request("GET", "/jobs/" + victim), 404)
        problem_ok(s.request("DELETE", "/jobs/" + victim), 404)
        check(s.request("GET", "/jobs/%s/events" % victim).status == 404, "events of a deleted job")
        # a page cursor naming it: 400 with the reason, never an empty page that looks like the end
        p = problem_ok(s.request("GET", "/jobs?after=" + victim), 400, "after")
        check("deleted" in p["errors"][0]["message"], "after a deleted job: %s" % p)
    problem_ok(s.request("GET", "/checkpoints/%s-%d" % (jid, STEPS)), 404)
    check(s.stop() == 0, "exit status")

    # with tokens: owner-only routes, and /healthz says a token is needed
    tok = os.path.join(tmp, "tokens")
    with open(tok, "w") as f:
        f.write("alice alice-secret-0123456789\nbob bob-secret-0123456789ab\n")
    os.chmod(tok, 0o600)
    t = Server(exe, args=["--token-file", tok]).start()
    h = t.request("GET", "/healthz").json()
    check(h["auth_required"] is True, "healthz with tokens: %s" % h)
    t.token = "alice-secret-0123456789"
    r = t.request("POST", "/checkpoints", blob, headers=OCTET)
    check(r.status == 201, "alice imports: %d" % r.status)
    aid = r.json()["id"]
    # refused before its body is read (a large one would meet a closed connection)
    problem_ok(t.request("POST", "/checkpoints", b"x", headers=OCTET, token=""), 401)
    bob = "bob-secret-0123456789ab"
    problem_ok(t.request("GET", "/checkpoints/%s-%d" % (aid, STEPS), token=bob), 403)
    problem_ok(t.request("DELETE", "/jobs/" + aid, token=bob), 403)
    problem_ok(t.request("POST", "/jobs/%s/resume" % aid, token=bob), 403)
    check(t.request("DELETE", "/jobs/" + aid).status == 204, "alice deletes her import")
    check(t.stop() == 0, "exit status")

    # a job folder that cannot be made (data/jobs replaced by a file: ENOTDIR, not a full
    # disk): 500 with the cause, never the server's path (it goes to the server's log)
    u = Server(exe).start()
    jobs = os.path.join(u.data, "jobs")
    os.rename(jobs, jobs + ".away")
    open(jobs, "w").close()
    r = u.request("POST", "/train", tiny(steps=1))
    os.unlink(jobs)
    os.rename(jobs + ".away", jobs)
    p = problem_ok(r, 500)
    check(u.data not in p["detail"] and "cannot be written" in p["detail"],
          "a job folder's error: %s" % p["detail"])
    check(u.stop() == 0, "exit status")
    print("test_jobs_api: ok (resumed bit for bit: %d tensors)" % len(want))


if __name__ == "__main__":
    main(sys.argv[1])
