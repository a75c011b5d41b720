"""test_upload_unpackers.py - an archive is unpacked on its request's HTTP thread, so at most one
fewer unpack at once than the HTTP threads (one with a single thread): a thread always stays free
for every other request. On a server of two HTTP threads an upload's unpacking is held by the
test-only DDPMD_TEST_HOLD_UPLOAD_FILE (released by the test: an event, not a sleep); meanwhile a
second upload is 503 upload-busy with Retry-After, /healthz answers, and nothing of the refused
upload stays on disk. Released, the first is 202, and an upload after it is 202 too.
Usage: test_upload_unpackers.py PATH/TO/ddpmd
"""
import io
import os
import struct
import sys
import tarfile
import tempfile
import threading
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, problem_ok, wait_for  # noqa: E402


def png(w, h):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress((b"\x00" + b"\x80" * w) * h)) + chunk(b"IEND", b""))


def archive():
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as t:
        data = png(8, 8)
        ti = tarfile.TarInfo("a.png")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return b.getvalue()


def upload(s, body):
    return s.request("POST", "/datasets", body=body, headers={"Content-Type": "application/x-tar"},
                     timeout=90)



def main(exe):
    d = tempfile.mkdtemp(prefix="ddpmd-it-")
    release = os.path.join(d, "release-uploads")
    s = Server(exe, data=d, args=["--http-threads", "2"],
               env={"DDPMD_TEST_HOLD_UPLOAD_FILE": release})
    s.own_data = True
    s.start()
    store = os.path.join(d, "datasets")
    body = archive()

    def entries():
        return sorted(os.listdir(store))

    before = entries()
    got = {}
    t = threading.Thread(target=lambda: got.update(r=upload(s, body)))
    t.start()
    # held: its temporary folder is made just before the hold
    wait_for(lambda: any(n.startswith(".tmp-") for n in entries()), "the held unpacking")
    held = entries()

    r = upload(s, body)
    p = problem_ok(r, 503)
    check(p["type"].endswith("upload-busy"), "type %s" % p["type"])
    check(r.header("Retry-After"), "503 without Retry-After")
    check("--http-threads 2" in p["detail"], "detail %s" % p["detail"])
    check(entries() == held, "the refused upload left %s" % (set(entries()) - set(held)))
    for _ in range(3):
        h = s.request("GET", "/healthz", timeout=30)
        check(h.status == 200, "/healthz while an upload unpacks: %d" % h.status)

    open(release, "w").close()
    t.join()
    check(got["r"].status == 202, "the held upload: %d %s" % (got["r"].status, got["r"].body[:200]))
    r = upload(s, body)
    check(r.status == 202, "an upload after the held one: %d %s" % (r.status, r.body[:200]))
    check(not any(n.startswith(".tmp-") or n.endswith(".part") for n in entries()),
          "temporaries left: %s" % entries())
    check(len(entries()) == len(before) + 2, "datasets %s" % entries())
    check(s.stop() == 0, "exit status")
    print("test_upload_unpackers: ok (one unpack at once on 2 HTTP threads; the second 503, "
          "/healthz answered)")


if __name__ == "__main__":
    main(sys.argv[1])
