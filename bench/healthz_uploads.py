"""healthz_uploads.py - /healthz latency while uploads unpack on the HTTP threads (not a test: it
asserts nothing). Each of UPLOADS (8) clients posts at once a gzip archive whose PNGs unpack large
(FILES 8192x8192 grey PNGs stored without compression, 64 MiB each, the archive ~0.1% of that),
while one client asks GET /healthz every 50 ms on a new connection; printed per --http-threads
setting: the max and median /healthz latency, the uploads' answers and their wall time. The
unpacking (and each PNG's header probe) runs on the request's HTTP thread; decoding follows on
the upload workers.
  python3 bench/healthz_uploads.py build/ddpmd [THREADS ...]   (default: 4 2)
Environment: UPLOADS (8), FILES (2 per archive).
"""
import gzip
import io
import os
import statistics
import struct
import sys
import tarfile
import threading
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from serverlib import Server  # noqa: E402

UPLOADS = int(os.environ.get("UPLOADS", "8"))
FILES = int(os.environ.get("FILES", "2"))
SIDE = 8192


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def stored_png(side):
    """a grey side x side PNG whose IDAT is stored (zlib level 0): the file is its pixels"""
    raw = zlib.compress((b"\x00" + b"\x00" * side) * side, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def archive():
    one = stored_png(SIDE)
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
        for i in range(FILES):
            ti = tarfile.TarInfo("img%d.png" % i)
            ti.size = len(one)
            t.addfile(ti, io.BytesIO(one))
    return gzip.compress(b.getvalue(), 6), FILES * len(one)


def run(exe, threads, body):
    s = Server(exe, args=["--http-threads", str(threads), "--upload-queue", str(UPLOADS),
                          "--upload-workers", "1"]).start()
    stop, lat, answers = threading.Event(), [], []

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            r = s.request("GET", "/healthz", timeout=120)
            lat.append((r.status, time.monotonic() - t0))
            time.sleep(0.05)

    def up():
        t0 = time.monotonic()
        r = s.request("POST", "/datasets", body=body,
                      headers={"Content-Type": "application/gzip"}, timeout=300)
        answers.append((r.status, time.monotonic() - t0))

    p = threading.Thread(target=probe)
    p.start()
    time.sleep(0.5)  # a few quiet probes first
    t0 = time.monotonic()
    ups = [threading.Thread(target=up) for _ in range(UPLOADS)]
    for t in ups:
        t.start()
    for t in ups:
        t.join()
    wall = time.monotonic() - t0
    time.sleep(0.5)
    stop.set()
    p.join()
    s.stop()
    s.cleanup()
    secs = [x for _, x in lat]
    codes = {}
    for c, _ in answers:
        codes[c] = codes.get(c, 0) + 1
    print("--http-threads %d: /healthz max %.3f s, median %.3f s over %d probes (all 200: %s); "
          "%d uploads answered %s in %.1f s (slowest %.1f s)"
          % (threads, max(secs), statistics.median(secs), len(secs),
             all(c == 200 for c, _ in lat), len(answers),
             ", ".join("%d x %d" % (n, c) for c, n in sorted(codes.items())), wall,
             max(x for _, x in answers)), flush=True)


def main():
    exe = sys.argv[1]
    threads = [int(x) for x in sys.argv[2:]] or [4, 2]
    body, unpacked = archive()
    print("archive: %d bytes, unpacking to %d MiB (%d PNGs of %dx%d); %d uploads at once; "
          "load average %s" % (len(body), unpacked >> 20, FILES, SIDE, SIDE, UPLOADS,
                               os.getloadavg()), flush=True)
    for t in threads:
        run(exe, t, body)
    print("load average after: %s" % (os.getloadavg(),))


if __name__ == "__main__":
    main()
