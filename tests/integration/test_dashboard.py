"""test_dashboard.py - the dashboard (web/, served at /) in a real headless Chromium driven by
Selenium, behind a small reverse proxy that strips a /ddpmd/ prefix the way nginx does (the server
runs with --path-prefix /ddpmd, so its JSON links name the prefix; the page must not need them;
GET /ddpmd redirects to /ddpmd/). The new-job page: its fields follow the JSON and the JSON its
fields; a small fmnist job is submitted THROUGH THE FIELDS; its page shows progress, the loss, lr,
gradient-norm and images/s charts (ticks at 1-2-5 steps, the hovered step's values equal to the
job's events), sample grids that open full size in a lightbox (with links to the PNG) and
checkpoints; samples requested through the form; the jobs and devices pages; the
datasets page lists, uploads (and refuses a non-tar), previews, starts a job form on, and deletes
a dataset; a canceled job's name, labels, Resume and Delete buttons (the delete confirmed by
a second click); a bad spec's errors shown at their fields (and at the JSON's lines for fields the form
lacks), a budget no plan fits at the budget's field; no token box on a server without tokens
(nor with a token kept in the tab: /healthz says auth_required false); no page wider than a
420 px screen; no console errors but the expected 4xx. Then with --token-file: the page shows
the token box once /healthz says auth_required (or a 401), and once given, every request (the
event stream and a dataset upload included) carries it in the Authorization header and no URL
holds it. Also over plain HTTP: the page's headers (CSP) and GET /jobs/{id}/grids/{step}.png.
Screenshots (desktop, and 420 px wide) go to a folder the test prints (TEST_SHOTS=DIR chooses it).
Exit 77 only when Chromium or its driver cannot start.
Usage: test_dashboard.py PATH/TO/ddpmd
"""
import atexit
import base64
import http.client
import http.server
import json
import math
import os
import shutil
import socketserver
import sys
import tempfile
import threading
import time

from serverlib import ROOT, Server, check, fail, need_fmnist
from test_upload import png, tar

PREFIX = "/ddpmd"
SHOTS = os.environ.get("TEST_SHOTS") or tempfile.mkdtemp(prefix="ddpmd-dashboard-")
SECRET = "s3cret-dashboard-token-0123456789"
NARROW = 420  # a phone's width: no page may scroll sideways at it

# the form's job: a few steps of the tiny model, a grid every 3 steps with a short schedule
SPEC = {
    "model": {"preset": "ddpm", "in_channels": 1, "image_size": 32,
              "block_out_channels": [32, 64, 64], "layers_per_block": 1,
              "attention_resolutions": [8], "norm_num_groups": 8},
    "data": {"dataset": "fashion-mnist", "validation": 4},
    "diffusion": {"timesteps": 20},
    "train": {"batch": 2, "steps": 5, "threads": 1, "warmup": 1, "ema_decay": 0.9},
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

        do_GET = do_POST = do_DELETE = relay

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


def click_enabled(d, what, by, sel):
    """Clicks the element once it is enabled. A running job's page redraws as its events come
    (the element found may be stale by the click): found again until a click lands."""
    def go():
        e = d.find_element(by, sel)
        if e.get_attribute("disabled") is not None:
            return False
        e.click()
        return True
    wait(d, what, go)


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


def full_shot(d, name):
    """the whole page, beyond the window's height (up to 5000 px)"""
    w, h = d.execute_script("return [innerWidth, document.scrollingElement.scrollHeight]")
    r = d.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": w, "height": min(h, 5000), "scale": 1}})
    path = os.path.join(SHOTS, name + ".png")
    with open(path, "wb") as f:
        f.write(base64.b64decode(r["data"]))
    return path


def screen(d, width):
    """the page's viewport as a screen `width` px wide (None: the window's own)"""
    if width is None:
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    else:
        d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                          {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})


def no_overflow(d, where):
    """nothing on the page is wider than the screen: it never scrolls sideways"""
    sw, cw, vw, wide = d.execute_script(
        "const vw = innerWidth, cw = document.scrollingElement.clientWidth;"
        "return [document.scrollingElement.scrollWidth, cw, vw, Array.from("
        "document.querySelectorAll('body *')).filter((e) => e.getBoundingClientRect().right > cw + 0.5)"
        ".slice(0, 6).map((e) => e.tagName + (e.id ? '#' + e.id : '') + (e.className && e.className.baseVal === undefined ? "
        "'.' + e.className : '') + ' ' + Math.round(e.getBoundingClientRect().right))]")
    check(vw == NARROW, "the screen is %d px wide, not %d" % (vw, NARROW))
    check(sw <= NARROW and sw <= cw, "%s: the page is %d px wide on a %d px screen (%d px beside its scroll bar); "
          "past its right edge: %s" % (where, sw, NARROW, cw, wide))


def token_box_hidden(d, where):
    check(not d.find_element("id", "token-form").is_displayed(),
          "%s: the token box shows on a server without tokens" % where)


def set_json(d, spec):
    """the spec's JSON typed into the editor (an input event, as typing makes)"""
    d.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))",
                     d.find_element("id", "spec"), json.dumps(spec, indent=2))


def type_into(d, field_id, text):
    from selenium.webdriver.common.keys import Keys
    e = d.find_element("id", field_id)
    e.send_keys(Keys.CONTROL, "a")
    e.send_keys(Keys.DELETE)
    if text:
        e.send_keys(text)


def editor_json(d):
    return json.loads(d.find_element("id", "spec").get_attribute("value"))


def new_page(d, url):
    d.get(url)
    wait(d, "the new-job page with its datasets", lambda: d.find_elements("css selector", "#view[data-ready]"))


def ticks(d, canvas, axis):
    t = d.find_element("id", canvas).get_attribute("data-%sticks" % axis)
    return [float(x) for x in t.split(",")] if t else []


def check_ticks(v, what, log=False):
    """evenly spaced multiples of a step of 1, 2 or 5 x 10^k, or on a log axis (log) one
    significant digit each; either way at least two, increasing"""
    check(len(v) >= 2 and all(a < b for a, b in zip(v, v[1:])), "%s: ticks %s" % (what, v))
    if log and all(abs(x / 10 ** math.floor(math.log10(x) + 1e-12) - round(x / 10 ** math.floor(math.log10(x) + 1e-12))) < 1e-6
                   for x in v):
        return  # 1, 2, 5 (or 1, 2, 3, 5) x 10^k; within half a decade they step as a linear axis does
    step = v[1] - v[0]
    m = step / 10 ** math.floor(math.log10(step) + 1e-12)
    check(any(abs(m - k) < 1e-6 for k in (1, 2, 5)), "%s: ticks %s step by %r, not 1, 2 or 5 x 10^k" % (what, v, step))
    for a, b in zip(v, v[1:]):
        check(abs((b - a) - step) <= 1e-9 * step, "%s: ticks %s are not evenly spaced" % (what, v))
    for x in v:
        check(abs(x / step - round(x / step)) < 1e-6, "%s: tick %r of %s is not a multiple of its step" % (what, x, v))


def hover(d, canvas, at):
    """the pointer over the chart's left (at=0) or right (at=1) end of its plot: the tooltip's
    step and {series key: the value it shows}"""
    from selenium.webdriver.common.action_chains import ActionChains
    c = d.find_element("id", canvas)
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", c)
    w = c.size["width"]
    dx = (51 - w / 2) if at == 0 else (w / 2 - 13)  # the plot spans x = 50 .. width - 12
    ActionChains(d).move_to_element_with_offset(c, int(dx), 0).perform()
    step = wait(d, "the tooltip of %s" % canvas, lambda: d.execute_script(
        "const t = document.querySelector(\".chart-tip[data-for='\" + arguments[0] + \"']\");"
        "return t && !t.hidden && t.dataset.step", canvas), timeout=10)
    vals = d.execute_script(
        "const t = document.querySelector(\".chart-tip[data-for='\" + arguments[0] + \"']\");"
        "return Object.fromEntries(Array.from(t.querySelectorAll('[data-key]')).map((r) => [r.dataset.key, r.querySelector('b').textContent]))",
        canvas)
    ActionChains(d).move_by_offset(0, 400).perform()  # off the chart again
    return int(step), {k: float(v) for k, v in vals.items()}


def close_to(a, b):
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b), 1e-12)


def js_unit_checks(d):
    """the chart's tick and label helpers on ranges a job has (steps, lr, losses)"""
    got = d.execute_script("return [niceTicks(1, 6, 14, true), niceTicks(10, 300, 4, true), niceTicks(0, 0.0002, 4),"
                           " niceTicks(0, 0.83, 5), logTicks(Math.log10(0.011), Math.log10(0.9)),"
                           " logTicks(Math.log10(0.15), Math.log10(1.2)), logTicks(Math.log10(0.8), Math.log10(1.2)),"
                           " logTicks(-6, 2),"
                           " [tickLabel(0.00015, 0.00005), tickLabel(0.25, 0.05), tickLabel(1500, 500), tickLabel(0, 1)]]")
    want = [{"ticks": [1, 2, 3, 4, 5, 6], "step": 1}, {"ticks": [100, 200, 300], "step": 100},
            {"ticks": [0, 5e-05, 0.0001, 0.00015, 0.0002], "step": 5e-05},
            {"ticks": [0, 0.2, 0.4, 0.6, 0.8], "step": 0.2},
            [0.02, 0.05, 0.1, 0.2, 0.5], [0.2, 0.3, 0.5, 1], [0.8, 0.9, 1, 1.1, 1.2],
            [1e-06, 1e-05, 0.0001, 0.001, 0.01, 0.1, 1, 10, 100], ["1.5e-4", "0.25", "1500", "0"]]
    check(got == want, "chart ticks and labels:\n got  %s\n want %s" % (got, want))


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


def new_job_checks(d, s, base):
    """the fields follow the JSON, the JSON its fields; a job submitted through the fields"""
    new_page(d, base + "#/new")
    token_box_hidden(d, "#/new")
    opts = [o.get_attribute("value") for o in d.find_elements("css selector", "#f-data-dataset option")]
    check("fashion-mnist" in opts, "the dataset field offers %s, not fashion-mnist (GET /datasets)" % opts)
    example = editor_json(d)
    check(example["data"]["dataset"] == "fashion-mnist", "the editor's example %s" % example)
    check(d.find_element("id", "f-train-batch").get_attribute("value") == str(example["train"]["batch"]) and
          d.find_element("id", "f-model-preset").get_attribute("value") == "fmnist-tiny",
          "the fields do not show the example spec")
    shot(d, "new-job")
    # the JSON -> the fields
    set_json(d, SPEC)
    wait(d, "the fields following the JSON", lambda: d.find_element("id", "f-train-steps").get_attribute("value") == "5"
         and d.find_element("id", "f-data-validation").get_attribute("value") == "4")
    # the fields -> the JSON: steps, a memory budget, a strategy, a model switched and back
    type_into(d, "f-train-steps", "6")
    type_into(d, "f-memory-vram_budget", "1GiB")
    from selenium.webdriver.support.ui import Select
    Select(d.find_element("id", "f-memory-offload")).select_by_value("off")
    Select(d.find_element("id", "f-model-preset")).select_by_value("seed-64")
    spec = editor_json(d)
    check(spec["model"] == {"preset": "seed", "in_channels": 1, "image_size": 64},
          "the seed model in the JSON: %s (the data's channels stay)" % spec["model"])
    check(d.find_element("id", "f-model-image_size").get_attribute("value") == "64", "the image size field after the switch")
    Select(d.find_element("id", "f-model-preset")).select_by_value("fmnist-tiny")
    spec = editor_json(d)
    want = json.loads(json.dumps(SPEC))
    want["train"]["steps"] = 6
    want["memory"] = {"vram_budget": "1GiB", "offload": "off"}
    check(spec == want, "the JSON after editing the fields:\n %s\nwant\n %s" % (spec, want))
    type_into(d, "f-memory-vram_budget", "")  # an emptied field leaves the JSON (its default applies)
    check("vram_budget" not in editor_json(d).get("memory", {}), "an emptied field stays in the JSON: %s" % editor_json(d))
    type_into(d, "f-memory-vram_budget", "1GiB")
    d.find_element("id", "spec-submit").click()
    jid = wait(d, "the job page after submitting",
               lambda: d.current_url.split("#/job/")[1] if "#/job/" in d.current_url else None)
    check(len(jid) == 17 and jid.startswith("j"), "job id %r" % jid)
    job = s.get_json("/jobs/" + jid)
    check(job["spec"]["train"]["steps"] == 6 and job["spec"]["output"]["sample_every"] == 3 and
          job["spec"]["memory"]["vram_budget"] in (1 << 30, "1GiB") and job["spec"]["memory"]["offload"] == "off",
          "the server got another spec: %s" % job["spec"])
    return jid


def job_page_checks(d, s, jid):
    """progress, grids, checkpoints, the plan bar, the four charts and their hover values"""
    wait(d, "progress on the job page", lambda: int(
        d.find_element("css selector", "#view [role=progressbar]").get_attribute("aria-valuenow")) > 0)
    shot(d, "job-running")
    wait(d, "a sample grid on the job page", lambda: d.execute_script(
        "const i = document.querySelector('#grids img'); return i && i.complete && i.naturalWidth > 0"))
    wait(d, "the job succeeding", lambda: d.find_element("css selector", "h2 .state").text == "succeeded")
    wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
    wait(d, "both grids", lambda: len(d.find_elements("css selector", "#grids img")) == 2)
    wait(d, "a checkpoint link", lambda: d.find_elements("css selector", "#checkpoints a[data-checkpoint]"))
    token_box_hidden(d, "#/job")
    # the charts draw what the job's progress events say (log_every 1: a point a step, or fewer
    # should the server thin them)
    steps = {e[2]["step"]: e[2] for e in s.events(jid)[0] if e[1] == "progress" and e[2].get("event") == "step"}
    logged = sorted(steps)
    check(len(logged) >= 2 and logged[-1] == 6, "the job's progress events are at steps %s" % logged)
    pts = int(wait(d, "the loss chart's points", lambda: d.find_element("id", "loss-chart").get_attribute("data-points")))
    vals = int(d.find_element("id", "loss-chart").get_attribute("data-val-points"))
    check(pts == len(logged), "the loss chart has %d train points, the job logged %d steps" % (pts, len(logged)))
    check(vals == len([x for x in steps.values() if "val_loss" in x]) and vals >= 1,
          "the chart has %d validation points" % vals)
    for c in ("lr-chart", "grad-chart", "ips-chart"):
        n = int(d.find_element("id", c).get_attribute("data-points") or 0)
        check(n == len(logged), "%s has %d points, the job logged %d steps" % (c, n, len(logged)))
    for c in ("loss-chart", "lr-chart", "grad-chart", "ips-chart"):
        xt = ticks(d, c, "x")
        check_ticks(xt, c + " steps")
        check(xt[0] >= logged[0] and xt[-1] <= logged[-1] and all(x == int(x) for x in xt), "%s: step ticks %s" % (c, xt))
        check_ticks(ticks(d, c, "y"), c + " values", log=c == "loss-chart")
    js_unit_checks(d)
    # the hovered step's values are the job's own
    a, z = logged[0], logged[-1]
    for canvas, at, step, keys in (("loss-chart", 1, z, {"loss": "loss"}), ("loss-chart", 0, a, {"loss": "loss"}),
                                   ("lr-chart", 1, z, {"lr": "lr"}), ("grad-chart", 1, z, {"gn": "grad_norm"}),
                                   ("ips-chart", 0, a, {"ips": "img_per_s"})):
        got_step, got = hover(d, canvas, at)
        check(got_step == step, "%s: the tooltip at the plot's %s end names step %d" % (canvas, "right" if at else "left", got_step))
        for k, ev in keys.items():
            check(k in got and close_to(got[k], steps[step][ev]),
                  "%s at step %d shows %s=%s, the job's event says %s" % (canvas, step, k, got.get(k), steps[step][ev]))
    from selenium.webdriver.common.action_chains import ActionChains
    c = d.find_element("id", "loss-chart")
    ActionChains(d).move_to_element_with_offset(c, int(c.size["width"] / 2 - 13), 0).perform()
    wait(d, "the tooltip again", lambda: d.find_element("css selector", ".chart-tip[data-for=loss-chart]").is_displayed())
    full_shot(d, "job-done")  # with the loss chart's tooltip at step 6
    nat = d.execute_script("const i = document.querySelector('#grids img'); return [i.naturalWidth, i.naturalHeight]")
    check(nat == [66, 66], "the grid is %s, 2x2 images of 32 px with 2-px gaps are 66x66" % nat)
    parts = [e.get_attribute("data-part") for e in d.find_elements("css selector", "[data-bar=plan] [data-part]")]
    check("weights" in parts and "arena" in parts and "process_baseline" in parts, "plan bar parts %s" % parts)
    check(d.find_element("id", "cancel").get_attribute("disabled") is not None, "cancel enabled on an ended job")
    # the plan bar takes any parts list: today's *_bytes fields, an array, the planner's columns
    job = s.get_json("/jobs/" + jid)
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


def lightbox_checks(d, s, jid):
    """a grid opens full size: the largest whole-number zoom the screen holds, with links to its PNG"""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    first = d.find_element("css selector", "#grids figure[data-step='3'] a.thumb")
    src = first.get_attribute("href")
    check(src.startswith("blob:"), "the grid's link %r is not its fetched PNG" % src)
    first.click()
    wait(d, "the lightbox", lambda: d.execute_script(
        "const g = document.getElementById('lightbox'), i = document.getElementById('lightbox-img');"
        "return g && g.open && i.complete && i.naturalWidth > 0 && i.style.width !== ''"))
    nw, nh, w, h, vw, vh, link, shown = d.execute_script(
        "const i = document.getElementById('lightbox-img'), r = i.getBoundingClientRect();"
        "return [i.naturalWidth, i.naturalHeight, r.width, r.height, innerWidth, innerHeight,"
        " document.getElementById('lightbox-open').href, i.src]")
    check([nw, nh] == [66, 66], "the lightbox shows a %dx%d image, the grid is 66x66" % (nw, nh))
    zoom = w / nw
    check(zoom == int(zoom) and h == nh * zoom, "the lightbox's zoom %r is not a whole number (%gx%g)" % (zoom, w, h))
    check(w <= vw and h <= vh and (w + nw > vw - 48 or h + nh > vh - 110),
          "the grid at %gx%g is not the largest whole zoom on a %dx%d screen" % (w, h, vw, vh))
    check(zoom >= 4, "the full-size grid is only %gx" % zoom)
    check(link == src and shown == src, "the lightbox shows %s and links %s, the grid is %s" % (shown, link, src))
    # the page's CSP (connect-src 'self') keeps even the page from fetching a blob: URL; the link is
    # the grid's own blob, fetched from GET jobs/ID/grids/3.png, and downloads under the job's name
    save = d.find_element("id", "lightbox-save")
    check(save.get_attribute("href") == src and save.get_attribute("download") == "%s-grid-3.png" % jid,
          "the download link %s (%s)" % (save.get_attribute("href"), save.get_attribute("download")))
    shot(d, "lightbox")
    d.find_element("id", "lightbox-next").click()
    wait(d, "the next grid in the lightbox", lambda: "step 6" in d.find_element("id", "lightbox-caption").text)
    ActionChains(d).send_keys(Keys.ESCAPE).perform()
    wait(d, "the lightbox closed", lambda: not d.execute_script("return document.getElementById('lightbox').open"))


def datasets_checks(d, s, base, tmp):
    """the datasets page: the built-in listed, an upload listed with its preview, a bad archive
    refused at the form, a job form started on the upload, the upload deleted"""
    d.get(base + "#/datasets")
    wait(d, "fashion-mnist on the datasets page", lambda: d.find_elements("css selector", "#datasets-table tr[data-dataset='fashion-mnist']"))
    token_box_hidden(d, "#/datasets")
    bad = os.path.join(tmp, "notes.tar")
    with open(bad, "wb") as f:
        f.write(b"these are not the images you are looking for\n" * 20)
    d.find_element("id", "ds-file").send_keys(bad)
    d.find_element("id", "ds-upload").click()
    e = wait(d, "the refused archive's error", lambda: d.find_element("css selector", "#ds-msg .error"))
    check("422" in e.text or "Unprocessable" in e.text, "the refused archive says %r" % e.text)
    good = os.path.join(tmp, "rgb16.tar.gz")
    with open(good, "wb") as f:
        f.write(tar([("img/%02d.png" % i, png(16, 16, grey=False, value=i * 13)) for i in range(20)], gz=True))
    d.find_element("id", "ds-file").send_keys(good)
    d.find_element("id", "ds-upload").click()
    did = wait(d, "the uploaded dataset", lambda: d.find_element("id", "ds-uploaded").get_attribute("data-dataset"))
    ds = wait(d, "the server's dataset", lambda: (lambda x: x if x.get("images") == 20 else None)(s.get_json("/datasets/" + did)))
    check(ds["size"] == 16 and ds["channels"] == 3, "the server's dataset %s" % ds)
    row = "#datasets-table tr[data-dataset='%s']" % did
    wait(d, "the upload's row", lambda: "20" in d.find_element("css selector", row).text)
    wait(d, "the upload's preview", lambda: d.execute_script(
        "const i = document.querySelector(arguments[0] + ' [data-preview] img'); return i && i.complete && i.naturalWidth > 0", row))
    d.find_element("css selector", row + " [data-preview] a.thumb").click()
    wait(d, "the preview full size", lambda: d.execute_script(
        "const i = document.getElementById('lightbox-img'); return document.getElementById('lightbox').open && i.naturalWidth > 0"))
    d.find_element("id", "lightbox-close").click()
    full_shot(d, "datasets")
    # the upload is validating until the server has decoded it; the page lists it again then
    wait(d, "the upload ready to train on", lambda: d.find_element("css selector", row + " a[data-train]")).click()
    wait(d, "the job form on the upload", lambda: d.find_elements("css selector", "#view[data-ready]") and
         d.find_element("id", "f-data-dataset").get_attribute("value") == did and editor_json(d)["data"]["dataset"] == did)
    d.get(base + "#/datasets")
    b = wait(d, "the delete button", lambda: d.find_element("css selector", row + " button[data-delete]"))
    b.click()
    wait(d, "the delete button asking again", lambda: "again" in b.text, timeout=5)
    time.sleep(0.5)
    check(s.request("GET", "/datasets/" + did).status == 200, "one click deleted the dataset")
    b.click()  # the second click deletes
    wait(d, "the row gone", lambda: not d.find_elements("css selector", row))
    check(s.request("GET", "/datasets/" + did).status == 404, "the dataset is still on the server")
    return did


def bad_spec_checks(d, base):
    """the server's errors at the form's fields, at the JSON's lines for the rest; a budget no plan fits at its field"""
    new_page(d, base + "#/new")
    bad = json.loads(json.dumps(SPEC))
    bad["train"]["batch"] = 0
    bad["train"]["warmpu"] = 1
    set_json(d, bad)
    d.find_element("id", "spec-submit").click()
    e = wait(d, "the train.batch error at its field", lambda: d.find_element(
        "css selector", "#spec-form-fields .field[data-path='train.batch'] [data-error-path='train.batch']"))
    check("65535" in e.text, "the train.batch error reads %r" % e.text)
    check(d.find_element("id", "f-train-batch").get_attribute("aria-invalid") == "true", "the batch field is not marked invalid")
    check(not d.find_elements("css selector", "#spec-fields [data-error-path='train.batch']"),
          "the train.batch error is also in the JSON's list: once, at the field, is enough")
    e = wait(d, "the unknown field's error", lambda: d.find_element(
        "css selector", "#spec-fields [data-path='train.warmpu'] [data-error-path='train.warmpu']"))
    line = d.find_element("css selector", "#spec-fields [data-path='train.warmpu']").text
    check(line.replace(" ", "") == ("warmpu:1" + e.text).replace(" ", ""), "the train.warmpu line reads %r" % line)
    full_shot(d, "bad-spec")
    type_into(d, "f-train-batch", "2")  # fixing a field takes its error away
    check(not d.find_elements("css selector", ".field[data-path='train.batch'] .field-error"), "the fixed field keeps its error")
    # a budget no plan fits: the planner's reason at the budget's field
    fits_not = json.loads(json.dumps(SPEC))
    fits_not["memory"] = {"vram_budget": "1MiB"}
    set_json(d, fits_not)
    d.find_element("id", "spec-submit").click()
    e = wait(d, "the budget's error at its field", lambda: d.find_element(
        "css selector", ".field[data-path='memory.vram_budget'] [data-error-path='memory.vram_budget']"))
    check("1.0 MiB" in e.text or "1048576" in e.text, "the budget's error reads %r" % e.text)


def narrow_checks(d, base, jid, sid):
    """every page at 420 px: nothing past the screen's right edge, the jobs table still shows each job's state"""
    screen(d, NARROW)
    try:
        d.get(base + "#/jobs")
        wait(d, "the jobs list", lambda: d.find_elements("css selector", "#jobs-table tr[data-job='%s'] .state" % jid))
        no_overflow(d, "#/jobs")
        token_box_hidden(d, "#/jobs at 420 px")
        st = d.find_element("css selector", "#jobs-table tr[data-job='%s'] .state" % jid)
        check(st.is_displayed() and st.text == "succeeded" and st.rect["x"] + st.rect["width"] <= NARROW,
              "the job's state on a narrow screen: %r at %s" % (st.text, st.rect))
        full_shot(d, "jobs-420")
        d.get(base + "#/job/" + jid)
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        wait(d, "its grids", lambda: len(d.find_elements("css selector", "#grids img")) == 2)
        no_overflow(d, "#/job")
        full_shot(d, "job-420")
        d.find_element("css selector", "#grids a.thumb").click()
        wait(d, "the lightbox", lambda: d.execute_script("return document.getElementById('lightbox').open && "
                                                         "document.getElementById('lightbox-img').style.width !== ''"))
        w = d.execute_script("return document.getElementById('lightbox-img').getBoundingClientRect().width")
        check(264 <= w <= NARROW, "the full-size grid is %g px wide on a %d px screen" % (w, NARROW))
        shot(d, "lightbox-420")
        d.find_element("id", "lightbox-close").click()
        new_page(d, base + "#/new")
        no_overflow(d, "#/new")
        full_shot(d, "new-job-420")
        for page, ready in (("#/datasets", "#datasets-table"), ("#/devices", "[data-device=cpu] [data-bar=budget]"),
                            ("#/samples", "#samples-table"), ("#/sample/" + sid, "#sample-grid img")):
            d.get(base + page)
            wait(d, page, lambda: d.find_elements("css selector", ready))
            no_overflow(d, page)
            if page in ("#/datasets", "#/samples"):
                full_shot(d, page[2:] + "-420")
    finally:
        screen(d, None)


def main(exe):
    need_fmnist()
    print("screenshots: %s" % SHOTS, flush=True)
    tmp = tempfile.mkdtemp(prefix="ddpmd-dash-")
    atexit.register(shutil.rmtree, tmp, True)
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
        # ---- a job through the form's fields (behind the prefix), its page, a grid full size ----
        jid = new_job_checks(d, s, base)
        job_page_checks(d, s, jid)
        lightbox_checks(d, s, jid)
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
        sid = d.current_url.split("#/sample/")[1]
        shot(d, "sample")
        # ---- the jobs and devices pages ----
        d.get(base + "#/jobs")
        wait(d, "the job in the jobs list", lambda: d.find_element(
            "css selector", "#jobs-table tr[data-job='%s'] .state" % jid).text == "succeeded")
        token_box_hidden(d, "#/jobs")
        shot(d, "jobs")
        d.get(base + "#/devices")
        wait(d, "the cpu device's budget bar", lambda: d.find_elements("css selector", "[data-device=cpu] [data-bar=budget]"))
        token_box_hidden(d, "#/devices")
        # a token kept in the tab does not bring the box back where /healthz says none is needed
        d.execute_script("sessionStorage.setItem('ddpmd.token', 'left-over')")
        d.refresh()  # the page starts again with the token kept
        wait(d, "the devices page again", lambda: d.find_elements("css selector", "[data-device=cpu] [data-bar=budget]"))
        time.sleep(0.5)  # /healthz answered
        token_box_hidden(d, "#/devices with a kept token")
        d.execute_script("sessionStorage.removeItem('ddpmd.token')")
        shot(d, "devices")
        # ---- the datasets page ----
        datasets_checks(d, s, base, tmp)
        # ---- a running job on the devices page, then canceled from its page ----
        long = json.loads(json.dumps(SPEC))
        long["train"]["steps"] = 2000
        long["output"].update(sample_every=0, checkpoint_every=0)
        long["data"]["validation"] = 0
        r = s.request("POST", "/train", dict(long, name="long-run", labels={"team": "vision"}))
        check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:200]))
        jid2 = r.json()["id"]
        s.wait_job(jid2, lambda j: j["state"] == "running" and j["step"] > 0, what="running")
        d.get(base + "#/devices")
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
        click_enabled(d, "the cancel button", "id", "cancel")
        wait(d, "the job canceled", lambda: d.find_element("css selector", "h2 .state").text == "canceled")
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        j2 = s.get_json("/jobs/" + jid2)
        check(j2["state"] == "canceled", "the server's job is not canceled")
        # its name and labels shown; Resume where it has a checkpoint; Delete (a second click
        # confirms) removes it and returns to the jobs list
        check(d.find_element("id", "job-name").text == "long-run" and
              d.find_element("id", "job-labels").text == "team: vision", "name and labels not shown")
        check(bool(d.find_elements("id", "resume")) == bool(j2["links"]["checkpoint"]),
              "a Resume button %s a checkpoint" % ("without" if not j2["links"]["checkpoint"] else "missing with"))
        d.find_element("id", "delete").click()
        check(s.request("GET", "/jobs/" + jid2).status == 200, "deleted at the first click")
        d.find_element("id", "delete").click()
        wait(d, "the jobs list after the delete", lambda: d.current_url.endswith("#/jobs"))
        wait(d, "the job deleted", lambda: s.request("GET", "/jobs/" + jid2).status == 404)
        # ---- a bad spec: the server's errors at their fields ----
        bad_spec_checks(d, base)
        # ---- a phone's width ----
        narrow_checks(d, base, jid, sid)
        errs = console_errors(d)
        check(all("422" in x["message"] and ("/train" in x["message"] or "/datasets" in x["message"]) for x in errs),
              "console errors other than the expected 422s of POST train and datasets: %s" % errs)
        requests_seen(d)
    finally:
        d.quit()
    s.stop()
    proxy.shutdown()

    # ---- with tokens ----
    tf = os.path.join(tmp, "tokens")
    with open(tf, "w") as f:
        f.write("alice %s\n" % SECRET)
    os.chmod(tf, 0o600)
    s = Server(exe, args=["--token-file", tf]).start()
    s.token = SECRET
    base = "http://127.0.0.1:%d/" % s.port
    d = browser()
    try:
        d.get(base + "#/jobs")
        wait(d, "the token prompt", lambda: d.find_element("id", "token-form").is_displayed() and
             "needs a token" in d.find_element("id", "token-state").text)
        shot(d, "token-needed")
        errs = console_errors(d)
        check(errs and all("401" in x["message"] for x in errs), "before the token: %s" % errs)
        d.find_element("id", "token-input").send_keys(SECRET)
        d.find_element("id", "token-save").click()
        wait(d, "the jobs page with the token", lambda: "No jobs yet" in d.find_element("id", "view").text)
        requests_seen(d)  # from here on every request must carry the token
        spec = json.loads(json.dumps(SPEC))
        spec["train"]["steps"] = 3
        spec["output"].update(sample_every=3, checkpoint_every=3)
        spec["data"]["validation"] = 0
        new_page(d, base + "#/new")
        set_json(d, spec)
        d.find_element("id", "spec-submit").click()
        jid = wait(d, "the job page", lambda: d.current_url.split("#/job/")[1] if "#/job/" in d.current_url else None)
        wait(d, "a grid with the token", lambda: d.execute_script(
            "const i = document.querySelector('#grids img'); return i && i.complete && i.naturalWidth > 0"))
        wait(d, "the job succeeding", lambda: d.find_element("css selector", "h2 .state").text == "succeeded")
        wait(d, "the job page final", lambda: d.find_elements("css selector", "#view[data-settled]"))
        check(s.get_json("/jobs/" + jid)["owner"] == "alice", "the job is not alice's")
        shot(d, "token-job")
        d.get(base + "#/datasets")
        wait(d, "the datasets page", lambda: d.find_elements("css selector", "#datasets-table"))
        d.find_element("id", "ds-file").send_keys(os.path.join(tmp, "rgb16.tar.gz"))
        d.find_element("id", "ds-upload").click()
        did = wait(d, "an upload with the token", lambda: d.find_element("id", "ds-uploaded").get_attribute("data-dataset"))
        check(s.get_json("/datasets/" + did)["owner"] == "alice", "the upload is not alice's")
        wait(d, "its preview with the token", lambda: d.execute_script(
            "const i = document.querySelector(\"tr[data-dataset='\" + arguments[0] + \"'] [data-preview] img\");"
            "return i && i.complete && i.naturalWidth > 0", did))
        errs = console_errors(d)
        check(not errs, "console errors with the token: %s" % errs)
        seen = requests_seen(d)
        api = [(u, h) for u, h in seen if u.startswith(base) and "/ui/" not in u and u.split("#")[0] != base
               and "readyz" not in u]
        check(any("/events" in u for u, _ in api), "no event stream request seen: %s" % [u for u, _ in api])
        check(any(u.endswith("/datasets") for u, _ in api), "no upload request seen: %s" % [u for u, _ in api])
        for u, h in seen:
            check(SECRET not in u, "the token is in a URL: %s" % u)
        for u, h in api:
            check(h.get("Authorization") == "Bearer " + SECRET, "%s without the token: %s" % (u, h))
    finally:
        d.quit()
    s.stop()
    print("test_dashboard: ok (screenshots in %s)" % SHOTS)


if __name__ == "__main__":
    main(sys.argv[1])
