"""test_metrics.py - GET /metrics over a real socket: the exposition passes `promtool check
metrics`, and its values follow a job exactly: jobs by state and the device's reserved/free bytes
while it runs, then steps, images (steps x batch), one step-time observation per step and the
requests counted by route pattern and status once it ended (unmatched ones by method, the event
stream's seconds apart from the latency); process_* and ddpmd_build_info (as `ddpmd --version`
says); a job killed by a signal counts as a failure with reason "signal". Usage: test_metrics.py PATH/TO/ddpmd
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from serverlib import Server, check, job_processes, need_fmnist, tiny

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def parse(text):
    """{(name, frozenset(labels)): value}"""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        check(m, "not a sample line: %r" % line)
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def get(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def scrape(s):
    r = s.request("GET", "/metrics")
    check(r.status == 200, "GET /metrics: %d %s" % (r.status, r.body[:300]))
    ct = r.header("Content-Type") or ""
    check(ct.startswith("text/plain") and "version=0.0.4" in ct, "content type %r" % ct)
    p = subprocess.run(["promtool", "check", "metrics"], input=r.body, capture_output=True,
                       timeout=60)
    check(p.returncode == 0, "promtool check metrics: %s %s" % (p.stdout, p.stderr))
    return parse(r.body.decode())


def scrape_until(s, name, want, **labels):
    """a scrape where name{labels} == want: a request is counted when libmicrohttpd completes it,
    which may be just after its client read the answer"""
    deadline = time.time() + 10
    while True:
        m = scrape(s)
        if get(m, name, **labels) == want or time.time() > deadline:
            return m
        time.sleep(0.05)


def main(exe):
    need_fmnist()
    if not shutil.which("promtool"):
        print("SKIP: promtool (Debian package prometheus) is not installed")
        sys.exit(77)
    s = Server(exe, args=["--max-retries", "0"]).start()
    m = scrape(s)
    check(get(m, "ddpmd_train_steps_total") == 0, "steps before any job")
    check(get(m, "ddpmd_jobs", state="succeeded") == 0, "succeeded before any job")
    budget = get(m, "ddpmd_device_budget_bytes", device="cpu")
    check(budget and budget > 0, "no budget gauge")
    check(get(m, "ddpmd_device_free_bytes", device="cpu") == budget, "free != budget when idle")

    # a job of 6 steps at batch 2, every step reported; it waits for the first one to be running
    r = s.request("POST", "/train", tiny(steps=6, log_every=1, checkpoint_every=3))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    job = s.wait_job(jid, lambda j: j["state"] == "running", what="running")
    m = scrape(s)
    if get(m, "ddpmd_jobs", state="running") == 1:  # it may have ended between the two calls
        check(get(m, "ddpmd_device_reserved_bytes", device="cpu") == job["reserved_bytes"],
              "reserved %s, the job reserved %d" % (get(m, "ddpmd_device_reserved_bytes",
                                                        device="cpu"), job["reserved_bytes"]))
        check(get(m, "ddpmd_device_free_bytes", device="cpu") == budget - job["reserved_bytes"],
              "free bytes while running")
        check(get(m, "ddpmd_device_running_jobs", device="cpu") == 1, "running jobs gauge")
    s.events(jid)
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded", "job %s" % j["state"])
    m = scrape_until(s, "ddpmd_http_requests_total", 1, method="GET", route="/jobs/{id}/events",
                     status="200")
    check(get(m, "ddpmd_jobs", state="succeeded") == 1, "succeeded jobs")
    check(get(m, "ddpmd_jobs", state="running") == 0, "running jobs after the end")
    check(get(m, "ddpmd_queue_length") == 0, "queue length")
    check(get(m, "ddpmd_train_steps_total") == 6, "steps %s" % get(m, "ddpmd_train_steps_total"))
    check(get(m, "ddpmd_train_images_total") == 12, "images %s" % get(m, "ddpmd_train_images_total"))
    check(get(m, "ddpmd_train_step_seconds_count") == 6, "step observations %s"
          % get(m, "ddpmd_train_step_seconds_count"))
    check(get(m, "ddpmd_train_step_seconds_sum") > 0, "step seconds sum")
    check(get(m, "ddpmd_device_reserved_bytes", device="cpu") == 0, "reserved after the end")
    check(get(m, "ddpmd_http_requests_total", method="POST", route="/train", status="202") == 1,
          "POST /train 202 count")
    check(get(m, "ddpmd_http_requests_total", method="GET", route="/jobs/{id}/events",
              status="200") == 1, "the event stream is counted by its pattern")
    check(get(m, "ddpmd_http_request_duration_seconds_count", method="POST", route="/train") == 1,
          "POST /train latency observations")
    # the stream's seconds are its own histogram, not the request latency's
    check(get(m, "ddpmd_sse_stream_duration_seconds_count") == 1, "one stream timed")
    check(get(m, "ddpmd_http_request_duration_seconds_count", method="GET",
              route="/jobs/{id}/events") is None, "the stream in the request latency")
    # the process and the build
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_max_fds", "process_start_time_seconds"):
        check((get(m, name) or 0) > 0, "%s: %s" % (name, get(m, name)))
    check(abs(get(m, "process_start_time_seconds") - time.time()) < 3600, "start time")
    build = [dict(labels) for (name, labels) in m if name == "ddpmd_build_info"]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    check(len(build) == 1 and build[0]["version"] in version and build[0]["revision"] in version,
          "ddpmd_build_info %s, ddpmd --version %r" % (build, version))
    # the raw URL is never a label
    check(not any(jid in v for (_, labels) in m for (_, v) in labels), "a job id in a label")
    for _ in range(3):
        s.request("GET", "/no/such/route")
    s.request("GET", "/jobs/j0000000000000000")
    s.request("BREW", "/coffee")
    scrape_until(s, "ddpmd_http_requests_total", 3, method="GET", route="unmatched", status="404")
    m = scrape_until(s, "ddpmd_http_requests_total", 1, method="GET", route="/jobs/{id}",
                     status="404")
    check(get(m, "ddpmd_http_requests_total", method="GET", route="unmatched", status="404") == 3,
          "unmatched 404s")
    check(sum(v for (name, labels), v in m.items() if name == "ddpmd_http_requests_total" and
              ("method", "other") in labels and ("route", "unmatched") in labels) == 1,
          "an unknown method is labelled other")
    check(not any(("method", "") in labels for (_, labels) in m), "a request without a method label")
    check(get(m, "ddpmd_http_requests_total", method="GET", route="/jobs/{id}", status="404") == 1,
          "GET /jobs/{id} 404")
    check(get(m, "ddpmd_job_failures_total", reason="exit_status") == 0, "no failures yet")

    # a job whose process is killed (--max-retries 0: no retry) fails by reason "signal"; the
    # steps it reported are counted exactly
    r = s.request("POST", "/train", tiny(steps=500, log_every=1, checkpoint_every=0))
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    j2 = r.json()["id"]
    s.wait_job(j2, lambda j: j["step"] >= 2, what="step 2")
    pids = job_processes(s.data)
    check(len(pids) == 1, "job processes %s" % pids)
    os.kill(pids[0], signal.SIGKILL)
    j = s.wait_job(j2, lambda j: j["state"] == "failed", what="failed")
    m = scrape(s)
    check(get(m, "ddpmd_job_failures_total", reason="signal") == 1, "failures by signal")
    check(get(m, "ddpmd_job_failures_total", reason="exit_status") == 0, "failures by exit")
    check(get(m, "ddpmd_jobs", state="failed") == 1, "failed jobs gauge")
    check(get(m, "ddpmd_train_steps_total") == 6 + j["step"],
          "steps %s after a job killed at step %d" % (get(m, "ddpmd_train_steps_total"), j["step"]))
    check(get(m, "ddpmd_train_images_total") == 12 + 2 * j["step"], "images after the kill")
    s.stop()
    print("test_metrics: ok")


if __name__ == "__main__":
    main(sys.argv[1])
