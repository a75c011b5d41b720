"""test_dashboard.py - the dashboard (web/, served at /) in a real headless Chromium driven by
Selenium, behind a small reverse proxy that strips a /ddpmd/ prefix the way nginx does (the server
runs with --path-prefix /ddpmd, so its JSON links name the prefix; the page must not need them;
GET /ddpmd redirects to /ddpmd/): submit a
small fmnist job THROUGH THE FORM, watch its progress, loss chart, sample grid and checkpoints
appear on the job page, request samples through the form and see their grid, the jobs and devices
pages, a bad spec's errors shown at their fields, and no console errors. Then with --token-file:
the page asks for a token, and once given, every request (the event stream included) carries it
in the Authorization header and no URL holds it. Also over plain HTTP: the page's headers (CSP)
and GET /jobs/{id}/grids/{step}.png. Screenshots go to a folder the test prints (TEST_SHOTS=DIR
chooses it). Exit 77 only when Chromium or its driver cannot start.
Usage: test_dashboard.py PATH/TO/ddpmd
"""
import atexit
import http.client
import http.server
import json
import os
import shutil
import socketserver
import sys
import tempfile
import threading
import time

from serverlib import ROOT, Server, check, fail, need_fmnist

PREFIX = "/ddpmd"
SHOTS = os.environ.get("TEST_SHOTS") or tempfile.mkdtemp(prefix="ddpmd-dashboard-")
SECRET = "s3cret-dashboard-token-0123456789"

# the form's job: a few steps of the tiny model, a grid every 3 steps with a short schedule
SPEC = {
    "model": {"preset": "ddpm", "in_channels": 1, "image_size": 32,
              "block_out_channels": [32, 64, 64], "layers_per_block": 1,
              "attention_resolutions": [8], "norm_num_groups": 8},
    "data": {"dataset": "fashion-mnist", "validation": 4},
    "diffusion": {"timesteps": 20},
    "train": {"batch": 2, "steps": 6, "threads": 1, "warmup": 1, "ema_decay": 0.9},
    "output": {"checkpoint_every": 3, "sample_every": 3, "log_every": 1, "keep_last": 2,
               "samples": 4},
}


class Proxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def start_proxy(upstream_port):
    """a prefix-stripping proxy on an ephemeral port: /ddpmd/X -> upstream /X, streamed"""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the response ends when the connection closes

        def log_message(self, *a):
            pass

        def relay(self):
            if not self.path.startswith(PREFIX + "/"):
                self.send_error(404, "outside the prefix")
                return
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            c = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
            hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            c.request(self.command, self.path[len(PREFIX):], body=body, headers=hdrs)
            r = c.getresponse()
            self.send_response(r.status, r.reason)
            for k, v in r.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.end_headers()
            try:
                while True:
                    chunk = r.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, http.client.HTTPException):
                pass  # the page left (an aborted stream) or the server ended it: so does this
            c.close()

        do_GET = do_POST = relay

    p = Proxy(("127.0.0.1", 0), H)
    threading.Thread(target=p.serve_forever, daemon=True).start()
    return p


def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print("SKIP: python3-selenium is not installed")
        sys.exit(77)
    for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not os.path.exists(exe):
            print("SKIP: %s is not installed (chromium, chromium-driver)" % exe)
            sys.exit(77)
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="ddpmd-chromium-")
    atexit.register(shutil.rmtree, profile, True)
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1400", "--no-first-run", "--disable-extensions",
              "--user-data-dir=" + profile):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    except Exception as e:  # the browser itself cannot start here: not a failure of ddpmd
        print("SKIP: chromium does not start: %s" % str(e).splitlines()[0])
        sys.exit(77)


def wait(d, what, fn, timeout=90):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # an element not there yet
            last = e
        time.sleep(0.1)
    shot(d, "timeout")
    fail("%s: not seen in %d s (%s); screenshot timeout.png" % (what, timeout, last))


def shot(d, name):
    path = os.path.join(SHOTS, name + ".png")
    d.save_screenshot(path)
    return path


def console_errors(d):
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def requests_seen(d):
    """the URLs and headers of every request the page made since the last call"""
    out = []
    for e in d.get_log("performance"):
        m = json.loads(e["message"])["message"]
        if m["method"] == "Network.requestWillBeSent":
            out.append((m["params"]["request"]["url"], m["params"]["request"]["headers"]))
    return out


def set_spec(d, spec):
    ta = d.find_element("id", "spec")
    d.execute_script("arguments[0].value = arguments[1]", ta, json.dumps(spec, indent=2))
    d.find_element("id", "spec-submit").click()


def http_checks(s):
    """the page's own headers, and a training job's grid route"""
    r = s.request("GET", "/")
    check(r.status == 200 and r.header("Content-Type").startswith("text/html"), "GET /: %d" % r.status)
    csp = r.header("Content-Security-Policy") or ""
    check("default-src 'none'" in csp and "connect-src 'self'" in csp, "CSP %r" % csp)
    check(b'src="ui/app.js"' in r.body and b'href="ui/style.css"' in r.body and b'"/' not in r.body,
          "index.html must name its files relative to itself")
    for path, ctype, name in (("/ui/app.js", "text/javascript", "app.js"),
                              ("/ui/style.css", "text/css", "style.css")):
        r = s.request("GET", path)
        check(r.status == 200 and r.header("Content-Type").startswith(ctype), "%s: %d" % (path, r.status))
        check(r.body == open(os.path.join(ROOT, "web", name), "rb").read(), "%s differs from web/%s" % (path, name))
    js = open(os.path.join(ROOT, "web", "app.js")).read()
    for bad in ("fetch('/", 'fetch("/', "new EventSource", "localStorage", "http://", "https://"):
        check(bad not in js, "app.js holds %r (absolute URLs, EventSource or a persistent token store)" % bad)


def main(exe):
    need_fmnist()
    print("screenshots: %s" % SHOTS, flush=True)
    s = Server(exe, args=["--path-prefix", PREFIX]).start()
    http_checks(s)
    r = s.request("GET", PREFIX)  # the page's relative URLs need the final '/'
    check(r.status == 301 and r.header("Location") == PREFIX + "/", "GET %s: %d %s" % (PREFIX, r.status, r.header("Location")))
    r = s.request("GET", PREFIX + "/")
    check(r.status == 200 and r.header("Content-Type").startswith("text/html"), "GET %s/: %d" % (PREFIX, r.status))
    proxy = start_proxy(s.port)
    base = "http://127.0.0.1:%d%s/" % (proxy.server_address[1], PREFIX)
    d = browser()
    try:
        # ---- submit through the form (behind the prefix) ----
        d.get(base + "#/new")
        wait(d, "the spec editor", lambda: d.find_element("id", "spec").get_attribute("value"))
        example = json.loads(d.find_element("id", "spec").get_attribute("value"))
        check(example["data"]["dataset"] == "fashion-mnist", "the editor's example %s" % example)
        set_spec(d, SPEC)
        jid = wait(d, "the job page after submitting",
                   lambda: d.current_url.split("#/job/")[1] if "#/job/" in d.current_url else None)
        check(len(jid) == 17 and jid.startswith("j"), "job id %r" % jid)
        job = s.get_json("/jobs/" + jid)
        check(job["spec"]["train"]["steps"] == 6 and job["spec"]["output"]["sample_every"] == 3,
              "the server got another spec: %s" % job["spec"])
        wait(d, "progress on the job page", lambda: int(
            d.find_element("css selector", "#view [role=progressbar]").get_attribute("aria-valuenow")) > 0)
        shot(d, "job-running")
        wait(d, "a sample grid on the job page", lambda: d.execute_script(
            "const i = document.querySelector('#grids img'); return i && i.complete && i.naturalWidth > 0"))
        wait(d, "the job succeeding", lambda: d.find_element("css selector", "h2 .state").text == "succeeded")
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        wait(d, "both grids", lambda: len(d.find_elements("css selector", "#grids img")) == 2)
        wait(d, "a checkpoint link", lambda: d.find_elements("css selector", "#checkpoints a[data-checkpoint]"))
        pts = int(wait(d, "the loss chart's points", lambda: d.find_element("id", "loss-chart").get_attribute("data-points")))
        vals = int(d.find_element("id", "loss-chart").get_attribute("data-val-points"))
        check(pts == 6, "the chart has %d train points, the job logged 6 steps" % pts)
        check(vals >= 1, "the chart has no validation point (data.validation is set)")
        nat = d.execute_script("const i = document.querySelector('#grids img'); return [i.naturalWidth, i.naturalHeight]")
        check(nat == [66, 66], "the grid is %s, 2x2 images of 32 px with 2-px gaps are 66x66" % nat)
        parts = [e.get_attribute("data-part") for e in d.find_elements("css selector", "[data-bar=plan] [data-part]")]
        check("weights" in parts and "arena" in parts and "process_baseline" in parts, "plan bar parts %s" % parts)
        check(d.find_element("id", "cancel").get_attribute("disabled") is not None, "cancel enabled on an ended job")
        # the plan bar takes any parts list: today's *_bytes fields, an array, the planner's columns
        got = d.execute_script("return planParts(arguments[0], arguments[1])", job["plan"], job["reserved_bytes"])
        check(sum(p["bytes"] for p in got) == job["reserved_bytes"], "plan parts %s do not add up to %d"
              % (got, job["reserved_bytes"]))
        got = d.execute_script("return planParts({parts: [{name: 'a', bytes: 3}, {name: 'b', bytes: 0}]}, 5)")
        check(got == [{"name": "a", "bytes": 3}, {"name": "other", "bytes": 2}], "array parts: %s" % got)
        got = d.execute_script("return planParts({parts: {device: {weights: 4, arena: 6}, host: {adam: 8, "
                               "ema: 0}, device_bytes: 10, host_bytes: 8}, process_baseline_bytes: 2}, 20)")
        check(got == [{"name": "weights", "bytes": 4}, {"name": "arena", "bytes": 6},
                      {"name": "adam (host)", "bytes": 8}, {"name": "process_baseline", "bytes": 2}],
              "planner columns: %s" % got)
        shot(d, "job-done")
        r = s.request("GET", "/jobs/%s/grids/3.png" % jid)
        check(r.status == 200 and r.header("Content-Type") == "image/png" and r.body[:4] == b"\x89PNG",
              "grids/3.png: %d" % r.status)
        for bad in ("03", "7", "-3", "3x"):
            r = s.request("GET", "/jobs/%s/grids/%s.png" % (jid, bad))
            check(r.status == 404, "grids/%s.png: %d, not 404" % (bad, r.status))
        # ---- samples through the form on the job page ----
        d.find_element("id", "sf-n").clear()
        d.find_element("id", "sf-n").send_keys("4")
        d.find_element("id", "sf-steps").send_keys("4")
        d.find_element("id", "sample-submit").click()
        wait(d, "the sample page's grid", lambda: d.execute_script(
            "const i = document.querySelector('#sample-grid img'); return i && i.complete && i.naturalWidth === 66"))
        shot(d, "sample")
        # ---- the jobs and devices pages ----
        d.get(base + "#/jobs")
        wait(d, "the job in the jobs list", lambda: d.find_element(
            "css selector", "#jobs-table tr[data-job='%s'] .state" % jid).text == "succeeded")
        shot(d, "jobs")
        d.get(base + "#/devices")
        wait(d, "the cpu device's budget bar", lambda: d.find_elements("css selector", "[data-device=cpu] [data-bar=budget]"))
        shot(d, "devices")
        # ---- a running job on the devices page, then canceled from its page ----
        long = json.loads(json.dumps(SPEC))
        long["train"]["steps"] = 2000
        long["output"].update(sample_every=0, checkpoint_every=0)
        long["data"]["validation"] = 0
        r = s.request("POST", "/train", long)
        check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:200]))
        jid2 = r.json()["id"]
        s.wait_job(jid2, lambda j: j["state"] == "running" and j["step"] > 0, what="running")
        # one script reads both widths: the page redraws the bars every 2 s (elements go stale)
        width, full = wait(d, "the running job's reservation in the budget bar", lambda: d.execute_script(
            "const b = document.querySelector('[data-device=cpu] [data-bar=budget]');"
            "const s = b && b.querySelector(\"[data-part='\" + arguments[0] + \"']\");"
            "return s ? [s.getBoundingClientRect().width, b.getBoundingClientRect().width] : null", jid2))
        dev = s.get_json("/devices")["devices"][0]
        want = full * r.json()["reserved_bytes"] / dev["budget_bytes"]
        check(abs(width - want) <= 2, "the job's segment is %.1f px, its share of the budget %.1f px" % (width, want))
        shot(d, "devices-running")
        d.get(base + "#/job/" + jid2)
        wait(d, "the cancel button", lambda: d.find_element("id", "cancel").get_attribute("disabled") is None)
        d.find_element("id", "cancel").click()
        wait(d, "the job canceled", lambda: d.find_element("css selector", "h2 .state").text == "canceled")
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        check(s.get_json("/jobs/" + jid2)["state"] == "canceled", "the server's job is not canceled")
        errs = console_errors(d)
        check(not errs, "console errors: %s" % errs)
        # ---- a bad spec: the server's errors at their fields ----
        d.get(base + "#/new")
        wait(d, "the spec editor", lambda: d.find_element("id", "spec"))
        bad = json.loads(json.dumps(SPEC))
        bad["train"]["batch"] = 0
        bad["train"]["warmpu"] = 1
        set_spec(d, bad)
        e = wait(d, "the train.batch error at its field", lambda: d.find_element(
            "css selector", "#spec-fields [data-path='train.batch'] [data-error-path='train.batch']"))
        check(e.text, "the train.batch error is empty")
        # at the spec's own line of the field (its name and value), not in a list after the spec
        line = d.find_element("css selector", "#spec-fields [data-path='train.batch']").text
        check(line.replace(" ", "") == ("batch:0" + e.text).replace(" ", ""), "the train.batch line reads %r" % line)
        e = wait(d, "the unknown field's error", lambda: d.find_element(
            "css selector", "#spec-fields [data-path='train.warmpu'] [data-error-path='train.warmpu']"))
        line = d.find_element("css selector", "#spec-fields [data-path='train.warmpu']").text
        check(line.replace(" ", "") == ("warmpu:1" + e.text).replace(" ", ""), "the train.warmpu line reads %r" % line)
        shot(d, "bad-spec")
        errs = console_errors(d)
        check(all("422" in x["message"] and "/train" in x["message"] for x in errs) and errs,
              "console errors other than the expected 422 of POST train: %s" % errs)
        requests_seen(d)
    finally:
        d.quit()
    s.stop()
    proxy.shutdown()

    # ---- with tokens ----
    tdir = tempfile.mkdtemp(prefix="ddpmd-dash-tok-")
    tf = os.path.join(tdir, "tokens")
    with open(tf, "w") as f:
        f.write("alice %s\n" % SECRET)
    s = Server(exe, args=["--token-file", tf]).start()
    s.token = SECRET
    base = "http://127.0.0.1:%d/" % s.port
    d = browser()
    try:
        d.get(base + "#/jobs")
        wait(d, "the token prompt", lambda: "needs a token" in d.find_element("id", "token-state").text)
        shot(d, "token-needed")
        errs = console_errors(d)
        check(errs and all("401" in x["message"] for x in errs), "before the token: %s" % errs)
        d.find_element("id", "token-input").send_keys(SECRET)
        d.find_element("id", "token-save").click()
        wait(d, "the jobs page with the token", lambda: "No jobs yet" in d.find_element("id", "view").text)
        requests_seen(d)  # from here on every request must carry the token
        d.get(base + "#/new")
        spec = json.loads(json.dumps(SPEC))
        spec["train"]["steps"] = 3
        spec["output"].update(sample_every=3, checkpoint_every=3)
        spec["data"]["validation"] = 0
        wait(d, "the spec editor", lambda: d.find_element("id", "spec"))
        set_spec(d, spec)
        jid = wait(d, "the job page", lambda: d.current_url.split("#/job/")[1] if "#/job/" in d.current_url else None)
        wait(d, "a grid with the token", lambda: d.execute_script(
            "const i = document.querySelector('#grids img'); return i && i.complete && i.naturalWidth > 0"))
        wait(d, "the job succeeding", lambda: d.find_element("css selector", "h2 .state").text == "succeeded")
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        check(s.get_json("/jobs/" + jid)["owner"] == "alice", "the job is not alice's")
        shot(d, "token-job")
        errs = console_errors(d)
        check(not errs, "console errors with the token: %s" % errs)
        seen = requests_seen(d)
        api = [(u, h) for u, h in seen if u.startswith(base) and "/ui/" not in u and u.split("#")[0] != base
               and "readyz" not in u]
        check(any("/events" in u for u, _ in api), "no event stream request seen: %s" % [u for u, _ in api])
        for u, h in seen:
            check(SECRET not in u, "the token is in a URL: %s" % u)
        for u, h in api:
            check(h.get("Authorization") == "Bearer " + SECRET, "%s without the token: %s" % (u, h))
    finally:
        d.quit()
    s.stop()
    shutil.rmtree(tdir, ignore_errors=True)
    print("test_dashboard: ok (screenshots in %s)" % SHOTS)


if __name__ == "__main__":
    main(sys.argv[1])
