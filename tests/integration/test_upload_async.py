"""test_upload_async.py - upload decoding off the HTTP threads (issue 23, item 3), over real
loopback sockets: eight uploads at once of a ~1 KB archive of three blank 8192x8192 PNGs (seconds
of decoding each) are answered 202 `validating` at once while /healthz keeps answering within a
second; a job naming a dataset still validating gets 409; the first becomes `ready` with its
preview; the ones a stop left validating are decoded again after the restart (none `failed`,
the first of them `ready`); a PNG whose image data
is corrupt (its header fine) makes its dataset `failed` with the reason, and a job naming it
422; the per-owner quota of pixels and bytes refuses (413 alone, 429 with the owner's others;
an archive over both is named by its bytes).
About 20 s.
Usage: test_upload_async.py PATH/TO/ddpmd
"""
import gzip
import io
import os
import struct
import sys
import tarfile
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, need_fmnist, problem_ok, tiny, validate  # noqa: E402

LATENCY_MAX = 1.0   # the contract: /healthz answers within a second whatever the uploads cost
UPLOADS = 8


def chunk(kind, data, bad_crc=False):
    crc = zlib.crc32(kind + data) & 0xffffffff
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc ^ (1 if bad_crc else 0))


def png(w, h, value=0, bad_idat_crc=False):
    raw = zlib.compress((b"\x00" + bytes([value]) * w) * h, 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", raw, bad_idat_crc) + chunk(b"IEND", b""))


def tar(entries, gz=True):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return gzip.compress(b.getvalue(), 9) if gz else b.getvalue()


def upload(s, body, timeout=60):
    return s.request("POST", "/datasets", body=body, headers={"Content-Type": "application/gzip"},
                     timeout=timeout)


def wait_state(s, did, want, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = s.get_json("/datasets/" + did)
        if d["state"] != "validating":
            check(d["state"] == want, "dataset %s became %s, not %s: %s" % (did, d["state"], want, d))
            return d
        time.sleep(0.1)
    check(False, "dataset %s still validating after %d s" % (did, timeout))


def probe_healthz(s, stop, lat):
    while not stop.is_set():
        t0 = time.monotonic()
        r = s.request("GET", "/healthz", timeout=30)
        lat.append((r.status, time.monotonic() - t0))
        time.sleep(0.05)


def phase_big(exe, d):
    big = tar([("img%d.png" % i, png(8192, 8192)) for i in range(3)])
    # UPLOADS + 1 HTTP threads: all eight unpack at once (at most --http-threads less one do;
    # test_upload_unpackers checks that bound)
    s = Server(exe, data=d, args=["--upload-workers", "1", "--upload-queue", str(UPLOADS),
                                  "--http-threads", str(UPLOADS + 1)]).start()
    stop, lat = threading.Event(), []
    prober = threading.Thread(target=probe_healthz, args=(s, stop, lat))
    prober.start()
    time.sleep(0.2)
    out = [None] * UPLOADS

    def one(i):
        t0 = time.monotonic()
        r = upload(s, big)
        out[i] = (r, time.monotonic() - t0)
    ths = [threading.Thread(target=one, args=(i,)) for i in range(UPLOADS)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    time.sleep(1.0)  # the worker decodes meanwhile
    stop.set()
    prober.join(30)
    worst = max(t for _, t in lat)
    check(all(st == 200 for st, _ in lat), "healthz statuses %s" % set(st for st, _ in lat))
    check(worst < LATENCY_MAX, "/healthz took %.2f s during the uploads (limit %.1f s)"
          % (worst, LATENCY_MAX))
    for r, took in out:
        check(r.status == 202, "upload: %d %s" % (r.status, r.body[:300]))
        check(took < LATENCY_MAX, "an upload was answered after %.2f s" % took)
    ds = [r.json() for r, _ in out]
    for x in ds:
        validate(x, "Dataset")
        check(x["images"] == 3 and x["size"] == 8192 and x["pixels"] == 3 * 8192 * 8192,
              "the header counts %s" % x)
    check(any(x["state"] == "validating" and not x["available"] for x in ds),
          "no upload was answered validating: %s" % [x["state"] for x in ds])
    print("eight uploads: answered 202 in at most %.3f s (%d bytes each); %d /healthz probes, "
          "max %.3f s" % (max(t for _, t in out), len(big), len(lat), worst), flush=True)
    # a job naming one still validating: 409, after its plan would have started
    last = ds[-1]["id"]
    spec = tiny(steps=1)
    spec["data"]["dataset"] = last
    r = s.request("POST", "/train", spec)
    if s.get_json("/datasets/" + last)["state"] == "validating":
        p = problem_ok(r, 409)
        check(p["type"] == "urn:ddpmd:problem:dataset-not-ready" and "validating" in p["detail"],
              "a validating dataset's job: %s" % p)
    t0 = time.monotonic()
    deadline = t0 + 120
    while time.monotonic() < deadline:  # the worker takes them in the order they came
        now = [x for x in s.get_json("/datasets")["datasets"] if x.get("state") == "ready"]
        if now:
            break
        time.sleep(0.1)
    check(now, "no upload ready after 120 s")
    first = now[0]
    check(first["available"] and first["channels"] == 1 and first["error"] is None, "%s" % first)
    r = s.request("GET", "/datasets/%s/preview.png" % first["id"])
    check(r.status == 200 and r.body[:8] == b"\x89PNG\r\n\x1a\n", "preview %d" % r.status)
    print("the first dataset ready %.2f s later, its preview served" % (time.monotonic() - t0),
          flush=True)
    check(s.stop() == 0, "the server's exit status")
    # the restart: what the stop left validating is decoded again, in the order it came
    s = Server(exe, data=d)
    s.own_data = True
    s.start()
    states = [s.get_json("/datasets/" + x["id"]) for x in ds]
    left = sorted(x["id"] for x in states if x["state"] == "validating")
    check(left and all(x["state"] in ("ready", "validating") for x in states),
          "after the restart %s" % [(x["state"], x["error"]) for x in states])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        if s.get_json("/datasets/" + left[0])["state"] != "validating":
            break
        time.sleep(0.1)
    again = s.get_json("/datasets/" + left[0])
    check(again["state"] == "ready" and again["available"], "the first one left: %s" % again)
    print("after the restart: %d left validating, the first ready %.2f s later" % (
        len(left), time.monotonic() - t0), flush=True)
    check(s.stop() == 0, "the restarted server's exit status")


def phase_failed(exe):
    s = Server(exe).start()
    body = tar([("ok.png", png(16, 16, 7)), ("crc.png", png(16, 16, 9, bad_idat_crc=True))])
    r = upload(s, body)
    check(r.status == 202, "the corrupt upload: %d %s" % (r.status, r.body[:300]))
    did = r.json()["id"]
    d = wait_state(s, did, "failed")
    check("crc.png" in d["error"] and "CRC" in d["error"] and not d["available"],
          "the failed dataset: %s" % d)
    check(s.data not in d["error"], "a server path in the reason: %s" % d["error"])
    check(not os.path.exists(os.path.join(s.data, "datasets", did, "images")),
          "a failed dataset kept its images")
    spec = tiny(steps=1)
    spec["data"]["dataset"] = did
    p = problem_ok(s.request("POST", "/train", spec), 422, "data.dataset")
    check("failed validation" in p["detail"] and "CRC" in p["detail"], "422 %s" % p["detail"])
    check(s.request("DELETE", "/datasets/" + did).status == 204, "a failed dataset deleted")
    print("failed: %s" % d["error"], flush=True)
    check(s.stop() == 0, "exit status")


def phase_quota(exe):
    s = Server(exe, args=["--upload-quota-pixels", "5000", "--upload-quota-bytes", "20000"]).start()
    one = tar([("a.png", png(64, 64, 1))])             # 4096 pixels
    r = upload(s, one)
    check(r.status == 202, "the first upload: %d %s" % (r.status, r.body[:300]))
    first = r.json()["id"]
    p = problem_ok(upload(s, tar([("b.png", png(64, 64, 2))])), 429)
    check(p["type"] == "urn:ddpmd:problem:upload-quota" and "--upload-quota-pixels" in p["detail"],
          "429 %s" % p)
    p = problem_ok(upload(s, tar([("c.png", png(80, 80, 3))])), 413)   # 6400 alone
    check(p["type"] == "urn:ddpmd:problem:upload-quota" and "pixels" in p["detail"], "413 %s" % p)
    noisy = bytes((i * 7919) & 0xff for i in range(64 * 65))           # ~4 KB that deflate keeps
    raw = zlib.compress(b"".join(b"\x00" + noisy[y * 64:(y + 1) * 64] for y in range(64)), 0)
    big = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", raw * 6) + chunk(b"IEND", b""))              # 4096 px, > 20000 bytes
    p = problem_ok(upload(s, tar([("d.png", big)])), 413)
    check(p["type"] == "urn:ddpmd:problem:upload-quota" and "--upload-quota-bytes" in p["detail"],
          "413 bytes %s" % p)
    # over both quotas alone (6400 px, > 20000 bytes): the bytes are judged first
    noisy80 = bytes((i * 7919) & 0xff for i in range(80 * 81))
    raw80 = zlib.compress(b"".join(b"\x00" + noisy80[y * 80:(y + 1) * 80] for y in range(80)), 0)
    both = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 80, 80, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", raw80 * 4) + chunk(b"IEND", b""))
    check(len(both) > 20000, "the PNG over both quotas holds %d bytes" % len(both))
    p = problem_ok(upload(s, tar([("e.png", both)])), 413)
    check(p["type"] == "urn:ddpmd:problem:upload-quota" and "--upload-quota-bytes" in p["detail"]
          and "pixels" not in p["detail"], "413 over both %s" % p)
    check(sorted(os.listdir(os.path.join(s.data, "datasets"))) == [first],
          "refused uploads left %s" % os.listdir(os.path.join(s.data, "datasets")))
    wait_state(s, first, "ready")
    check(s.request("DELETE", "/datasets/" + first).status == 204, "delete")
    r = upload(s, tar([("b.png", png(64, 64, 2))]))
    check(r.status == 202, "after the delete the quota holds it: %d %s" % (r.status, r.body[:200]))
    print("quota: 429 with the owner's other dataset, 413 alone (pixels, bytes, both: bytes "
          "named), room again after a delete", flush=True)
    check(s.stop() == 0, "exit status")


def main(exe):
    need_fmnist()
    phase_failed(exe)
    phase_quota(exe)
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    phase_big(exe, d)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
