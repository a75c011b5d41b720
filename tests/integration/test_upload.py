"""test_upload.py - POST /datasets over a real socket. A table of hostile archives (a bomb by
ratio, a header declaring more than the limit, path traversal, an absolute path, symlink,
hardlink, device node, FIFO, 100k tiny files, truncation, not a tar, a bad PNG header inside,
...) each gets its exact status and problem type on the request, leaves nothing under
DATA/datasets, and the server stays healthy; a PNG whose header is fine but whose image data is
corrupt is accepted (202) and its dataset then fails with the reason, its images removed. Then a
good upload (plain and gzip) is answered 202 validating, becomes ready, and is listed,
described, previewed, trained on by id, refused deletion (409) while its job is queued or
running, and deleted after.
Usage: test_upload.py PATH/TO/ddpmd
"""
import gzip
import http.client
import io
import os
import re
import struct
import sys
import tarfile
import tempfile
import time
import zlib

from serverlib import Response, Server, check, fail, need_fmnist, problem_ok, tiny, validate

MAX_BYTES = 4 << 20       # --upload-max-bytes
MAX_UNPACKED = 8 << 20    # --upload-max-unpacked
MAX_FILES = 1000          # --upload-max-files


def png(w, h, grey=True, level=6, value=None, bad_crc=False):
    """an 8-bit grey (or RGB) PNG of w x h"""
    def chunk(kind, data):
        crc = zlib.crc32(kind + data) & 0xffffffff
        if bad_crc and kind == b"IDAT":
            crc ^= 1
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
    ch = 1 if grey else 3
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 3 + (value or 0)) & 0xff) for x in range(w * ch))
                    for y in range(h)) if value is None or value >= 0 else \
        b"".join(b"\0" + bytes(w * ch) for _ in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0 if grey else 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
            chunk(b"IDAT", zlib.compress(rows, level)) + chunk(b"IEND", b""))


def tar(entries, gz=False):
    """entries: (name, bytes) files or (name, tarfile type, linkname) others"""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
        for e in entries:
            ti = tarfile.TarInfo(e[0])
            if len(e) == 2:
                ti.size = len(e[1])
                t.addfile(ti, io.BytesIO(e[1]))
            else:
                ti.type, ti.linkname = e[1], e[2]
                t.addfile(ti)
    raw = b.getvalue()
    return gzip.compress(raw, 6) if gz else raw


def many_tiny(n):
    """a gzip tar of n valid 1x1 PNGs, its headers made by hand (tarfile takes a minute for 100k)"""
    data = png(1, 1)
    pad = b"\0" * (-len(data) % 512)
    out = []
    for i in range(n):
        h = bytearray(512)
        name = b"f%06d.png" % i
        h[0:len(name)] = name
        h[100:108] = b"0000644\0"
        h[108:116] = b"0000000\0"
        h[116:124] = b"0000000\0"
        h[124:136] = b"%011o\0" % len(data)
        h[136:148] = b"00000000000\0"
        h[148:156] = b"        "
        h[156:157] = b"0"
        h[257:265] = b"ustar  \0"
        h[148:156] = b"%06o\0 " % sum(h)
        out += [bytes(h), data, pad]
    out.append(b"\0" * 1024)
    return gzip.compress(b"".join(out), 1)


def dataset_files(s):
    return sorted(os.listdir(os.path.join(s.data, "datasets")))


def post(s, body, ctype="application/x-tar"):
    if isinstance(body, int):  # only the headers: the answer must come before any byte is sent
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.putrequest("POST", "/datasets")
        c.putheader("Content-Type", ctype)
        c.putheader("Content-Length", str(body))
        c.endheaders()
        r = c.getresponse()
        out = Response(r.status, r.getheaders(), r.read())
        c.close()
        return out
    return s.request("POST", "/datasets", body=body, headers={"Content-Type": ctype}, timeout=120)


def hostile_table():
    sig = b"\x89PNG\r\n\x1a\n"
    good = png(8, 8)
    # a PNG whose IHDR declares 20000 x 20000 (over IMAGE_MAX_SIDE)
    huge = png(8, 8)
    huge = huge[:16] + struct.pack(">II", 20000, 20000) + huge[24:29] + \
        struct.pack(">I", zlib.crc32(b"IHDR" + struct.pack(">II", 20000, 20000) + huge[24:29]) & 0xffffffff) + huge[33:]
    big_valid = png(512, 512, level=0, value=-1)  # ~262 KB each, stored: 40 of them > 8 MiB
    ok_gz = tar([("a.png", good)] * 1, gz=True)
    return [
        # (name, body, content type, status, problem type)
        ("bomb by ratio: 40 valid 256 KiB PNGs in a small gzip", tar(
            [("b%02d.png" % i, big_valid) for i in range(40)], gz=True), "application/gzip", 413,
         "archive-too-large"),
        ("one entry declaring 64 MiB of zeros", tar([("z.png", sig + bytes(64 << 20))], gz=True),
         "application/gzip", 413, "archive-too-large"),
        ("traversal ../", tar([("ok.png", good), ("../evil.png", good)]), None, 422,
         "archive-unsafe-entry"),
        ("traversal in the middle", tar([("a/../../evil.png", good)]), None, 422,
         "archive-unsafe-entry"),
        ("absolute path", tar([("/tmp/ddpmd-evil.png", good)]), None, 422, "archive-unsafe-entry"),
        ("symlink", tar([("ok.png", good), ("link.png", tarfile.SYMTYPE, "/etc/passwd")]), None,
         422, "archive-unsafe-entry"),
        ("hardlink", tar([("ok.png", good), ("hard.png", tarfile.LNKTYPE, "ok.png")]), None, 422,
         "archive-unsafe-entry"),
        ("character device", tar([("dev.png", tarfile.CHRTYPE, "")]), None, 422, "archive-unsafe-entry"),
        ("block device", tar([("blk.png", tarfile.BLKTYPE, "")]), None, 422, "archive-unsafe-entry"),
        ("FIFO", tar([("fifo.png", tarfile.FIFOTYPE, "")]), None, 422, "archive-unsafe-entry"),
        ("hidden name", tar([(".hidden.png", good)]), None, 422, "archive-unsafe-entry"),
        ("too deep", tar([("a/b/c.png", good)]), None, 422, "archive-unsafe-entry"),
        ("the same name twice", tar([("a.png", good), ("a.png", good)]), None, 422,
         "archive-unsafe-entry"),
        ("a file where a folder is", tar([("c/a.png", good), ("c", good)]), None, 422,
         "archive-not-png"),
        ("a folder where a file is", tar([("c.png", good), ("c.png", tarfile.DIRTYPE, "")]), None,
         422, "archive-unsafe-entry"),
        ("a file inside a file", tar([("c.png", good), ("c.png/a.png", good)]), None, 422,
         "archive-unsafe-entry"),
        ("100k tiny files", many_tiny(100000), "application/gzip", 413, "archive-too-many-entries"),
        ("truncated gzip", ok_gz[:len(ok_gz) // 2], "application/gzip", 422, "archive-corrupt"),
        ("truncated tar inside a file", tar([("a.png", png(64, 64, level=0))])[:3000], None, 422,
         "archive-corrupt"),
        ("not a tar", b"this is not an archive at all, just words" * 40, None, 422,
         "archive-corrupt"),
        ("empty body", b"", None, 422, "archive-corrupt"),
        ("bad PNG inside (text)", tar([("ok.png", good), ("bad.png", b"hello, not a png")]), None,
         422, "archive-not-png"),
        ("PNG over the side limit", tar([("huge.png", huge)]), None, 422, "archive-not-png"),
        ("signature only", tar([("sig.png", sig)]), None, 422, "archive-not-png"),
        ("a .txt file", tar([("readme.txt", b"hi")]), None, 422, "archive-not-png"),
        ("folders only", tar([("d", tarfile.DIRTYPE, "")]), None, 422, "archive-empty"),
        ("over --upload-max-bytes, chunked", (b"\0" * 65536 for _ in range(MAX_BYTES // 65536 + 1)),
         None, 413, "archive-too-large"),
        ("over --upload-max-bytes, by Content-Length", MAX_BYTES + 1, None, 413,
         "archive-too-large"),
    ]


def wait_ready(s, did, want="ready", timeout=60):
    """the dataset once its images are decoded (its state no longer validating)"""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = s.get_json("/datasets/" + did)
        if d["state"] != "validating":
            check(d["state"] == want, "dataset %s: %s, not %s (%s)" % (did, d["state"], want,
                                                                      d.get("error")))
            return d
        time.sleep(0.05)
    fail("dataset %s still validating after %d s" % (did, timeout))


def main(exe):
    need_fmnist()
    s = Server(exe, args=["--upload-max-bytes", str(MAX_BYTES), "--upload-max-unpacked",
                          str(MAX_UNPACKED), "--upload-max-files", str(MAX_FILES)]).start()
    check(dataset_files(s) == [], "datasets/ not empty at start: %s" % dataset_files(s))
    for name, body, ctype, status, kind in hostile_table():
        t0 = time.time()
        r = post(s, body, ctype or "application/x-tar")
        p = problem_ok(r, status)
        check(p["type"] == "urn:ddpmd:problem:" + kind, "%s: type %s (%s)" % (name, p["type"], p["detail"]))
        check(s.data not in p["detail"], "%s: a server path in the detail %r" % (name, p["detail"]))
        left = dataset_files(s)
        check(left == [], "%s: left on disk: %s" % (name, left))
        check(s.get_json("/healthz")["status"] == "ok", "%s: unhealthy after" % name)
        print("  %-50s %d %-26s %.2fs" % (name, status, kind, time.time() - t0))
    check(not os.path.exists("/tmp/ddpmd-evil.png"), "an absolute path was written")
    check(not os.path.exists(os.path.join(s.data, "evil.png")), "a traversal was written")
    # the wrong content type before any byte is read
    problem_ok(post(s, tar([("a.png", png(8, 8))]), "application/json"), 415)
    # a header that passes, image data that does not: accepted, then failed with the reason
    r = post(s, tar([("crc.png", png(8, 8, bad_crc=True))]))
    check(r.status == 202 and r.json()["state"] == "validating", "bad CRC: %d %s" % (r.status, r.body[:200]))
    bad_id = r.json()["id"]
    d = wait_ready(s, bad_id, "failed")
    check("crc.png" in d["error"] and "CRC" in d["error"] and s.data not in d["error"], "failed %s" % d)
    check(os.listdir(os.path.join(s.data, "datasets", bad_id)) == ["dataset.json"],
          "a failed dataset kept %s" % os.listdir(os.path.join(s.data, "datasets", bad_id)))
    check(s.request("DELETE", "/datasets/" + bad_id).status == 204, "a failed dataset deleted")
    check(dataset_files(s) == [], "left on disk: %s" % dataset_files(s))

    # a good dataset: 20 grey 32x32 images in a class folder and at the top
    imgs = [("cls%d/i%02d.png" % (i % 2, i), png(32, 32, value=i * 11)) for i in range(18)]
    imgs += [("top%d.png" % i, png(32, 32, value=200 + i)) for i in range(2)]
    for gz in (False, True):
        r = post(s, tar(imgs, gz=gz), "application/gzip" if gz else "application/x-tar")
        check(r.status == 202, "upload (gzip %s): %d %s" % (gz, r.status, r.body[:300]))
        d = r.json()
        check(r.header("Location") == "/datasets/" + d["id"], "Location %s" % r.header("Location"))
        check(d["state"] == "validating" or d["state"] == "ready", "state %s" % d["state"])
        first = d
        d = wait_ready(s, d["id"])
        # beyond its state, a ready dataset adds its decoded samples' count (source_bytes)
        later = ("state", "available", "links", "source_bytes")
        check({k: v for k, v in first.items() if k not in later} ==
              {k: v for k, v in d.items() if k not in later},
              "the 202 body %s and the ready dataset %s differ beyond their state" % (first, d))
        check(d["images"] == 20 and d["size"] == 32 and d["channels"] == 1, "dataset %s" % d)
        check(d["source_bytes"] == 20 * 32 * 32, "source_bytes %s" % d.get("source_bytes"))
        check(d["bytes"] == sum(len(b) for _, b in imgs), "bytes %s" % d["bytes"])
        check(d["sizes"] == {"min_width": 32, "max_width": 32, "min_height": 32, "max_height": 32},
              "sizes %s" % d["sizes"])
    validate(d, "Dataset")
    did = d["id"]
    lst = s.get_json("/datasets")
    validate(lst, "DatasetList")
    ids = [x["id"] for x in lst["datasets"]]
    check(ids[0] == "fashion-mnist" and did in ids and len(ids) == 3, "listed %s" % ids)
    check(s.get_json("/datasets/" + did) == d, "GET /datasets/{id} differs from the ready one")
    r = s.request("GET", "/datasets/%s/preview.png" % did)
    check(r.status == 200 and r.header("Content-Type") == "image/png", "preview %d" % r.status)
    w, h = struct.unpack(">II", r.body[16:24])
    check(r.body[:8] == b"\x89PNG\r\n\x1a\n" and (w, h) == (4 * 48 + 3 * 2, 4 * 48 + 3 * 2),
          "preview %dx%d" % (w, h))
    problem_ok(s.request("GET", "/datasets/d0000000000000000"), 404)
    problem_ok(s.request("GET", "/datasets/..%2f..%2fetc"), 404)
    problem_ok(s.request("DELETE", "/datasets/fashion-mnist"), 403)
    files = sorted(os.listdir(os.path.join(s.data, "datasets", did, "images")))
    check(files == ["cls0", "cls1", "top0.png", "top1.png"], "unpacked %s" % files)

    # train on it by id: the job reads its 20 images
    spec = tiny(steps=3, log_every=1, checkpoint_every=3)
    spec["data"]["dataset"] = did
    r = s.request("POST", "/train", spec)
    check(r.status == 202, "POST /train on an upload: %d %s" % (r.status, r.body[:400]))
    jid = r.json()["id"]
    check(r.json()["spec"]["data"]["dataset"] == did, "the job shows the id, not a path")
    evs, _ = s.events(jid)
    j = s.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded", "job on the upload: %s %s" % (j["state"], j.get("error")))
    logs = [e[2].get("line", "") for e in evs if e[1] == "log"]
    m = [re.search(r"parameters, (\d+) training images", l) for l in logs]
    m = [x for x in m if x]
    print("  the job's data line: " + m[0].string.strip() if m else "  no data line")
    check(m and int(m[0].group(1)) == 20, "the job did not read the upload's 20 images: %s" % logs[:3])
    check(s.data not in " ".join(logs), "a server path in the job's log")
    # the job held it as its bytes and left the one decoded copy the next jobs map
    copy = os.path.join(s.data, "datasets", did, "samples.bin")
    check(any("decoded copy written" in l for l in logs) and os.path.exists(copy),
          "no decoded copy after the first job: %s" % logs[:4])
    before = os.stat(copy)
    good = open(copy, "rb").read()
    # it cannot be deleted while a job that names it is queued or running
    long = tiny(steps=100000, checkpoint_every=0, log_every=1)
    long["data"]["dataset"] = did
    lid = s.request("POST", "/train", long).json()["id"]
    s.wait_job(lid, lambda j: j["state"] == "running", what="running")
    # the second job maps the copy: no decode, the file untouched
    for _ in range(300):
        if "training images" in s.request("GET", "/jobs/%s/logs" % lid).body.decode():
            break
        time.sleep(0.1)
    llog = s.request("GET", "/jobs/%s/logs" % lid).body.decode()
    after = os.stat(copy)
    check("20 images mapped from the dataset's decoded copy" in llog and "decoding" not in llog
          and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns),
          "the second job did not map the decoded copy: %s" % llog[:600])
    p = problem_ok(s.request("DELETE", "/datasets/" + did), 409)
    check(p["type"] == "urn:ddpmd:problem:dataset-in-use" and p["jobs"] == [lid], "409 %s" % p)
    check(s.request("POST", "/jobs/%s/cancel" % lid).status in (200, 202), "cancel")
    s.wait_job(lid, lambda j: j["state"] == "canceled", what="canceled")
    # a corrupt copy is never trained on: the next job decodes the images again and writes it
    # anew, and trains as the first job did
    open(copy, "wb").write(good[:-1] + bytes([good[-1] ^ 1]))
    r = s.request("POST", "/train", spec)
    check(r.status == 202, "POST /train after the corruption: %d %s" % (r.status, r.body[:300]))
    cid = r.json()["id"]
    s.wait_job(cid, lambda j: j["state"] in ("succeeded", "failed"), what="the third job ending")
    clog = s.request("GET", "/jobs/%s/logs" % cid).body.decode()
    check(s.get_json("/jobs/" + cid)["state"] == "succeeded" and "not used (unusable)" in clog and
          "decoded copy written" in clog and open(copy, "rb").read() == good,
          "a corrupt copy: %s" % clog[:800])
    loss = [open(os.path.join(s.data, "jobs", x, "out", "loss.csv")).read() for x in (jid, cid)]
    check(loss[0] == loss[1], "the job after the corruption trained otherwise: %s" % loss)
    bad = tiny(steps=1)
    bad["data"]["dataset"] = "d0123456789abcdef"
    problem_ok(s.request("POST", "/train", bad), 422, "data.dataset")
    r = s.request("DELETE", "/datasets/" + did)
    check(r.status == 204, "DELETE after the job: %d %s" % (r.status, r.body[:200]))
    problem_ok(s.request("GET", "/datasets/" + did), 404)
    check(did not in dataset_files(s) and len(dataset_files(s)) == 1, "left %s" % dataset_files(s))
    s.stop()

    # with tokens: no token is 401 before any byte is read; an upload is its owner's (another
    # token: 403 and not listed, also not trainable), an admin sees it
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    tf = os.path.join(d, "tokens")
    alice, bob, root = "a" * 20, "b" * 20, "r" * 20
    with open(tf, "w") as f:
        f.write("alice %s\nbob %s\nroot %s admin\n" % (alice, bob, root))
    os.chmod(tf, 0o600)  # a token file must be private (api_tokens_load)
    t = Server(exe, data=d, args=["--token-file", tf]).start()
    t.own_data = True
    r = post(t, 1 << 20, "application/x-tar")
    problem_ok(r, 401)
    check(dataset_files(t) == [], "a refused upload left %s" % dataset_files(t))
    t.token = alice
    r = post(t, tar(imgs))
    check(r.status == 202 and r.json()["owner"] == "alice", "alice's upload %d" % r.status)
    aid = r.json()["id"]
    wait_ready(t, aid)
    t.token = bob
    problem_ok(t.request("GET", "/datasets/" + aid), 403)
    problem_ok(t.request("DELETE", "/datasets/" + aid), 403)
    check(aid not in [x["id"] for x in t.get_json("/datasets")["datasets"]], "bob lists alice's")
    spec = tiny(steps=1)
    spec["data"]["dataset"] = aid
    problem_ok(t.request("POST", "/train", spec), 422, "data.dataset")
    t.token = root
    check(aid in [x["id"] for x in t.get_json("/datasets")["datasets"]], "the admin does not list it")
    check(t.request("DELETE", "/datasets/" + aid).status == 204, "the admin deletes it")
    t.stop()
    print("test_upload: ok")


if __name__ == "__main__":
    main(sys.argv[1])
