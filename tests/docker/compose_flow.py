"""compose_flow.py - the checks of tests/docker/test_container.sh on docker/compose.yaml as shipped
(its bridge network; nginx's port published on 127.0.0.1 only), every request through nginx at
127.0.0.1:PORT/ddpmd/ with a bearer token, in three calls around what the shell does between them:
  start PORT TOKEN DOCKER DDPMD NGINX       the two containers on the compose network, ddpmd
                                            unpublished, nginx reaching it by its service name;
                                            a training job past its first checkpoint: its id out
  crash PORT TOKEN DOCKER DDPMD NGINX JOB   the ddpmd process killed from the host (SIGKILL, no
                                            checkpoint); Docker starts it again (restart:
                                            unless-stopped), nginx reaches the new one, and the
                                            job resumes from its last checkpoint and succeeds
  rebooted PORT TOKEN DOCKER DDPMD NGINX JOB  after the shell restarted dockerd: both containers
                                            started again by their policy, the job still there
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from container_flow import P, docker, wait_healthy  # noqa: E402
from serverlib import Server, check, fail, tiny  # noqa: E402

STEPS = 30


def inspect(dk, fmt, container):
    return docker(dk, "inspect", "-f", fmt, container)


def wait_for(what, pred, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    fail("%s: not within %d s" % (what, timeout))


def wait_job(s, jid, pred, what, timeout=300):
    def get():
        try:
            r = s.request("GET", "/jobs/" + jid, timeout=10)
        except OSError:
            return None
        return r.json() if r.status == 200 and pred(r.json()) else None
    return wait_for(what, get, timeout)


def start(s, dk, ddpmd, nginx):
    nets = {c: inspect(dk, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", c).split()
            for c in (ddpmd, nginx)}
    check(len(nets[ddpmd]) == 1 and nets[ddpmd] == nets[nginx] and nets[ddpmd][0].endswith("_default"),
          "the containers' networks: %s" % nets)
    driver = docker(dk, "network", "inspect", "-f", "{{.Driver}}", nets[ddpmd][0])
    check(driver == "bridge", "the compose network's driver is %s" % driver)
    ports = {c: inspect(dk, "{{range $p, $b := .NetworkSettings.Ports}}{{$p}}={{range $b}}"
                        "{{.HostIp}}:{{.HostPort}}{{end}} {{end}}", c).split() for c in (ddpmd, nginx)}
    check(ports[ddpmd] == ["8080/tcp="], "ddpmd's ports: %s (published?)" % ports[ddpmd])
    check(ports[nginx] == ["8080/tcp=127.0.0.1:%d" % s.port], "nginx's ports: %s" % ports[nginx])
    for c in (ddpmd, nginx):
        policy = inspect(dk, "{{.HostConfig.RestartPolicy.Name}}", c)
        check(policy == "unless-stopped", "%s: restart policy %s" % (c, policy))

    wait_healthy(s)
    check(s.request("GET", "/jobs", token="").status == 401, "no token: not 401")
    r = s.request("POST", "/train", tiny(steps=STEPS, checkpoint_every=5, keep_last=3))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    j = wait_job(s, jid, lambda j: j["state"] not in ("queued", "running") or j["step"] > 5, "the job's first checkpoint")
    check(j["state"] == "running" and j["step"] < STEPS, "the job before the crash: %s step %s"
          % (j["state"], j["step"]))
    print(jid)


def crash(s, dk, ddpmd, nginx, jid):
    pid = int(inspect(dk, "{{.State.Pid}}", ddpmd))
    check(pid > 0, "the ddpmd container runs no process")
    os.kill(pid, 9)
    wait_for("Docker starting ddpmd again after its process was killed",
             lambda: inspect(dk, "{{.RestartCount}} {{.State.Running}}", ddpmd) == "1 true", 120)
    check(int(inspect(dk, "{{.State.Pid}}", ddpmd)) != pid, "the same process")
    check(inspect(dk, "{{.RestartCount}}", nginx) == "0", "nginx was restarted too")
    wait_healthy(s)  # through nginx: it reaches the new ddpmd
    # the job waited after step 7 (test_container.sh's DDPMD_TEST_HOLD_*), so the kill met it
    # running however fast its steps are; the resumed run would wait there again: released
    docker(dk, "exec", ddpmd, "touch", "/data/ddpmd-test-release")
    j = wait_job(s, jid, lambda j: j["state"] in ("succeeded", "failed", "canceled"), "the job's end")
    check(j["state"] == "succeeded" and j["step"] == STEPS and j["starts"] == 2,
          "the job after the crash: %s step %s starts %s" % (j["state"], j["step"], j["starts"]))


def rebooted(s, dk, ddpmd, nginx, jid):
    for c in (ddpmd, nginx):
        wait_for("%s running again after dockerd restarted" % c,
                 lambda c=c: inspect(dk, "{{.State.Running}}", c) == "true", 120)
    wait_healthy(s)
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded" and j["step"] == STEPS, "the job after dockerd restarted: %s" % j)
    print("compose_flow: ok (bridge network; ddpmd killed and restarted by Docker, the job resumed; "
          "both containers back after dockerd restarted)")


def main(what, port, token, docker_bin, ddpmd, nginx, jid=None):
    s = Server(None)
    s.port, s.prefix, s.token = int(port), P, token
    dk = [docker_bin]
    if what == "start":
        start(s, dk, ddpmd, nginx)
    elif what == "crash":
        crash(s, dk, ddpmd, nginx, jid)
    elif what == "rebooted":
        rebooted(s, dk, ddpmd, nginx, jid)
    else:
        fail("unknown step %s" % what)


if __name__ == "__main__":
    main(*sys.argv[1:])
