"""container_flow.py - the requests of tests/docker/test_container.sh, all through the nginx
container at 127.0.0.1:NGINX_PORT/ddpmd/ with a bearer token: POST /train a small job, follow its
event stream while it runs, `docker restart` the ddpmd container mid-training (SIGTERM: the job
stops at a step with a checkpoint on the data volume), and see the job resume from that
checkpoint after the restart (a second start whose first step follows the checkpoint's step,
the event ids going on from where they were) and succeed; download its checkpoint (safetensors
checked), POST /samples, fetch the grid PNG; the container's user, volume and health.
Usage: container_flow.py NGINX_PORT TOKEN DDPMD_CONTAINER DOCKER
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from serverlib import Server, check, fail, tiny, validate  # noqa: E402
from test_flow import safetensors_ok  # noqa: E402
from test_nginx import Stream  # noqa: E402
from test_samples import png_size, wait_sample  # noqa: E402

P = "/ddpmd"
STEPS = 40


def docker(cmd, *args):
    return subprocess.run(cmd + list(args), check=True, capture_output=True, text=True).stdout.strip()


def wait_healthy(s, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if s.request("GET", "/healthz", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    fail("GET %s/healthz through nginx never answered 200" % P)


def read_until(st, pred, what):
    """events of st until pred(event) (that one included); the stream must not end first"""
    out = []
    while True:
        kind, ev = st.next()
        check(kind not in ("end", "timeout"), "the stream through nginx: %s before %s (%s)" % (kind, what, out[-3:]))
        if kind == "event":
            out.append(ev)
            if pred(ev):
                return out


def main(port, token, container, docker_bin):
    dk = [docker_bin]
    s = Server(None)
    s.port, s.prefix, s.token = int(port), P, token
    wait_healthy(s)
    check(s.request("GET", "/jobs", token="").status == 401, "no token: not 401")

    r = s.request("POST", "/train", tiny(steps=STEPS, checkpoint_every=5, keep_last=3))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    check(r.header("Location") == P + "/jobs/" + jid, "Location %s" % r.header("Location"))

    # the stream while it runs: a checkpoint arrives while the job is still running
    st = token_stream(int(port), jid, token)
    before = read_until(st, lambda e: e[1] == "checkpoint" and e[2]["step"] >= 5, "the first checkpoint")
    # and a step past it, so that only a checkpoint made at SIGTERM holds every reported step
    first_ck = before[-1][2]["step"]
    before += read_until(st, lambda e: e[1] == "progress" and e[2].get("event") == "step" and
                         e[2]["step"] > first_ck, "a step after the first checkpoint")
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "running" and j["step"] < STEPS, "the job after its first checkpoint: %s" % j["state"])
    steps_seen = [e[2]["step"] for e in before if e[1] == "progress" and e[2].get("event") == "step"]
    check(steps_seen and steps_seen[-1] < STEPS, "no progress before the first checkpoint")

    # restart the ddpmd container mid-training
    t0 = time.time()
    docker(dk, "restart", "-t", "120", container)
    restart_s = time.time() - t0
    # the job waited after step 7 (test_container.sh's DDPMD_TEST_HOLD_*), so the restart met it
    # running however fast its steps are; released now for the rest of the run
    docker(dk, "exec", container, "touch", "/data/ddpmd-test-release")
    rest = []
    while True:  # what the stream got before the server went away
        kind, ev = st.next()
        if kind != "event":
            break
        rest.append(ev)
    st.close()
    before += rest
    last_id = before[-1][0]
    ckpts = [e[2]["step"] for e in before if e[1] == "checkpoint"]
    wait_healthy(s)
    j = s.get_json("/jobs/" + jid)
    check(j["state"] in ("queued", "running", "succeeded"), "the job after the restart: %s" % j)

    # the rest of the job, from where the stream stopped
    st = token_stream(int(port), jid, token, last=last_id)
    after = read_until(st, lambda e: e[1] == "state" and e[2]["state"] in ("succeeded", "failed", "canceled"),
                       "the job's end")
    st.close()
    check(after[0][0] == last_id + 1, "the stream resumed at %d, not %d" % (after[0][0], last_id + 1))
    check(after[-1][2]["state"] == "succeeded", "the job ended %s" % after[-1][2])
    j = s.get_json("/jobs/" + jid)
    validate(j, "Job")
    check(j["starts"] == 2 and j["step"] == STEPS, "after the restart: starts %d, step %d" % (j["starts"], j["step"]))
    # resumed, not restarted: the first step after the restart follows the newest checkpoint the
    # first process wrote, and that one (made at SIGTERM) holds every step it reported
    resumed = [e[2]["step"] for e in after if e[1] == "progress" and e[2].get("event") == "step"]
    all_ck = ckpts + [e[2]["step"] for e in after if e[1] == "checkpoint"]
    check(resumed, "no steps after the restart")
    last_ck = max(c for c in all_ck if c < resumed[0])
    check(resumed[0] == last_ck + 1 and last_ck >= 5, "after the restart the job went on at step %d; its newest "
          "checkpoint was step %d (checkpoints %s)" % (resumed[0], last_ck, all_ck))
    done = max(e[2]["step"] for e in before if e[1] == "progress" and e[2].get("event") == "step")
    check(last_ck >= done, "steps were lost: the first process reported step %d, its newest checkpoint was %d"
          % (done, last_ck))

    # the loss chart (cairo and a font in the image), the final checkpoint and a sample
    lp = s.request("GET", "/jobs/%s/loss.png" % jid)
    check(lp.status == 200 and png_size(lp.body)[0] > 0, "loss.png: %d %s" % (lp.status, lp.body[:200]))
    logs = s.request("GET", "/jobs/%s/logs" % jid).body.decode(errors="replace")
    check("fontconfig" not in logs.lower() and "cairo" not in logs.lower(), "the job's log: %s" % logs[-800:])
    cks = s.get_json("/jobs/%s/checkpoints" % jid)["checkpoints"]
    check(cks and cks[-1]["step"] == STEPS, "checkpoints %s" % cks)
    saved, s.prefix = s.prefix, ""
    blob = s.request("GET", cks[-1]["url"]).body
    s.prefix = saved
    check(len(blob) == cks[-1]["bytes"], "checkpoint download: %d of %d bytes" % (len(blob), cks[-1]["bytes"]))
    safetensors_ok(blob)
    r = s.request("POST", "/samples", {"job": jid, "n": 4, "steps": 4, "batch": 4})
    check(r.status == 202, "POST /samples: %d %s" % (r.status, r.body[:300]))
    smp = wait_sample(s, r.json()["id"], timeout=300)
    check(smp["state"] == "succeeded", "sample %s" % smp)
    saved, s.prefix = s.prefix, ""
    g = s.request("GET", smp["links"]["grid"])
    s.prefix = saved
    check(g.status == 200 and png_size(g.body)[0] > 0, "grid PNG: %d" % g.status)

    # the container: its user, the /data volume, its health
    check(docker(dk, "exec", container, "id", "-u") == "10001", "ddpmd does not run as uid 10001")
    mounts = docker(dk, "inspect", "-f", "{{range .Mounts}}{{.Type}}:{{.Destination}} {{end}}", container)
    check("volume:/data" in mounts.split(), "no /data volume: %s" % mounts)
    deadline = time.time() + 60
    health = ""
    while time.time() < deadline:
        health = docker(dk, "inspect", "-f", "{{.State.Health.Status}}", container)
        if health == "healthy":
            break
        time.sleep(1)
    check(health == "healthy", "HEALTHCHECK says %s" % health)
    print("container_flow: ok (docker restart took %.1f s; the job resumed at step %d after checkpoint %d)"
          % (restart_s, resumed[0], last_ck))


def token_stream(port, jid, token, last=None):
    h = {"Authorization": "Bearer " + token}
    if last is not None:
        h["Last-Event-ID"] = str(last)
    return Stream(port, P + "/jobs/%s/events" % jid, 120, h)


if __name__ == "__main__":
    main(*sys.argv[1:5])
