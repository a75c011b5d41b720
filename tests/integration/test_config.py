"""test_config.py - every `ddpmd serve` option also comes from a config file (--config FILE or
DDPMD_CONFIG; lines NAME = VALUE) and from its DDPMD_* variable, the command line winning over
the environment, which wins over the file. Checked on two options a client can observe: the
cpu budget (GET /devices) and the largest body (413), each set in one, two or three places; the
list options (--device, --vram-budget DEV=SIZE) and the sizes they take, refused with the reason
when malformed or repeated; every
option --help lists is accepted in a file and names its variable; bad files are refused with
the file and line. Usage: test_config.py PATH/TO/ddpmd
"""
import os
import re
import subprocess
import sys
import tempfile

from serverlib import Server, check

GIB = 1 << 30


def budget(exe, conf=None, env=None, args=()):
    e = dict(env or {})
    if conf:
        e["DDPMD_CONFIG"] = conf
    s = Server(exe, args=list(args), env=e).start()
    b = s.get_json("/devices")["devices"][0]["budget_bytes"]
    check(s.stop() == 0, "exit status")
    return b


def big_body_status(exe, env=None, args=()):
    s = Server(exe, args=list(args), env=env).start()
    body = '{"pad": "%s"}' % ("x" * 3000)  # 3 KiB: over 2048, under 4096
    st = s.request("POST", "/train", body, headers={"Content-Type": "application/json"}).status
    check(s.stop() == 0, "exit status")
    return st


def run(exe, *args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run([exe, "serve", *args], capture_output=True, text=True, env=e,
                           timeout=timeout)
    except subprocess.TimeoutExpired:  # it started serving instead of refusing
        return None, "", "still running after %d s" % timeout
    return p.returncode, p.stdout, p.stderr


def main(exe):
    tmp = tempfile.mkdtemp(prefix="ddpmd-config-")

    def conf(name, text):
        path = os.path.join(tmp, name)
        open(path, "w").write(text)
        return path

    c1 = conf("one.conf", "# the budget\n\n  vram-budget =  cpu=1GiB  \nmax-queue = 7\n")
    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    check(budget(exe) == mem, "the default budget is the machine's memory")
    check(budget(exe, args=["--config", c1]) == GIB, "budget from --config")
    check(budget(exe, conf=c1) == GIB, "budget from DDPMD_CONFIG")
    check(budget(exe, conf=c1, env={"DDPMD_VRAM_BUDGET": "cpu=2GiB"}) == 2 * GIB,
          "the environment over the file")
    check(budget(exe, conf=c1, env={"DDPMD_VRAM_BUDGET": "cpu=2GiB"},
                 args=["--vram-budget", "cpu=3GiB"]) == 3 * GIB, "the command line over both")
    check(budget(exe, conf=c1, args=["--vram-budget", "cpu=3GiB"]) == 3 * GIB,
          "the command line over the file")

    # --vram-budget: a bare size is the one device's; each device's budget once, for a device
    # served; sizes are decimal digits and a unit (no inf, hex, spaces, exponents)
    check(budget(exe, args=["--vram-budget", "2GiB"]) == 2 * GIB, "a bare size")
    check(budget(exe, env={"DDPMD_DEVICE": "cpu", "DDPMD_VRAM_BUDGET": "cpu=1.5GiB"}) == 3 * GIB // 2,
          "a fraction from the environment")
    data = os.path.join(tmp, "never")
    for args, want in (
            (["--vram-budget", "cpu=1GiB", "--vram-budget", "cpu=2GiB"], "given twice"),
            (["--vram-budget", "cpu=1GiB,cpu=2GiB"], "given twice"),
            (["--device", "cpu", "--device", "cpu"], "--device cpu is given twice"),
            (["--device", "gpu"], "--device takes cpu, cuda or cuda:N"),
            (["--vram-budget", "cuda:0=1GiB"], "no such --device"),
            (["--vram-budget", "cpu=inf"], "--vram-budget takes"),
            (["--vram-budget", "cpu=0x1000"], "--vram-budget takes"),
            (["--vram-budget", "cpu= 8GiB"], "--vram-budget takes"),
            (["--vram-budget", "cpu=1e9"], "--vram-budget takes"),
            (["--vram-budget", "cpu=0"], "--vram-budget takes")):
        rc, _, err = run(exe, "--listen", "127.0.0.1:0", "--data", data, *args, timeout=15)
        check(rc == 2 and want in err, "%s: %s %s" % (args, rc, err))
    # a list option's lines in one file add up (then: the same device twice)
    rc, _, err = run(exe, "--config", conf("dev.conf", "device = cpu\ndevice = cpu\n"),
                     "--listen", "127.0.0.1:0", "--data", data, timeout=15)
    check(rc == 2 and "--device cpu is given twice" in err, "devices from a file: %s %s" % (rc, err))
    check(not os.path.exists(data), "a refused start made its data directory")

    small = conf("small.conf", "max-body = 2048\n")
    large = conf("large.conf", "max-body = 4096\n")
    check(big_body_status(exe, args=["--config", small]) == 413, "max-body from the file")
    check(big_body_status(exe, args=["--config", large]) != 413, "max-body 4096 from the file")
    check(big_body_status(exe, env={"DDPMD_MAX_BODY": "2048"}, args=["--config", large]) == 413,
          "DDPMD_MAX_BODY over the file")
    check(big_body_status(exe, env={"DDPMD_MAX_BODY": "2048"},
                          args=["--config", small, "--max-body", "4096"]) != 413,
          "--max-body over the environment")

    # every option of --help: accepted in a file, and its DDPMD_ variable named beside it
    rc, out, _ = run(exe, "--help")
    check(rc == 0, "--help exit %d" % rc)
    opts = re.findall(r"^  --([a-z][a-z-]*) ", out, re.M)
    check(len(opts) >= 20 and "vram-budget" in opts and "device" in opts, "options %s" % opts)
    for name in opts:
        if name in ("routes", "config"):
            continue
        env = "DDPMD_" + name.upper().replace("-", "_")
        check(env in out, "--help names no %s for --%s" % (env, name))
        path = conf("opt.conf", "%s = x\n" % name)
        rc, routes, err = run(exe, "--config", path, "--routes")
        check(rc == 0 and "GET /healthz" in routes, "--%s in a config file: %d %s" % (name, rc, err))

    # refused files, with the file and line
    for text, want in (("listen = 127.0.0.1:0\nbogus = 1\n", ":2: unknown option 'bogus'"),
                       ("max-queue 3\n", ":1: expected NAME = VALUE"),
                       ("\n\nmax-queue =   \n", ":3: max-queue has no value"),
                       ("--max-queue = 3\n", "unknown option '--max-queue'")):
        path = conf("bad.conf", text)
        rc, _, err = run(exe, "--config", path, "--routes")
        check(rc == 2 and want in err and path in err, "%r: %d %s" % (text, rc, err))
    rc, _, err = run(exe, "--config", os.path.join(tmp, "missing.conf"), "--routes")
    check(rc == 2 and "missing.conf" in err, "a missing file: %d %s" % (rc, err))
    rc, _, err = run(exe, "--routes", env={"DDPMD_CONFIG": os.path.join(tmp, "missing.conf")})
    check(rc == 2 and "missing.conf" in err, "a missing DDPMD_CONFIG: %d %s" % (rc, err))
    # a value the file gives is checked as the flag's would be
    rc, _, err = run(exe, "--config", conf("q.conf", "max-queue = many\n"), "--listen",
                     "127.0.0.1:0", "--data", os.path.join(tmp, "d"))
    check(rc == 2 and "--max-queue" in err, "a bad value from the file: %d %s" % (rc, err))
    # --cpu-cores' default: the CPUs the server may run on (taskset), not the machine's
    mine = os.sched_getaffinity(0)
    if len(mine) >= 2:
        one = min(mine)
        os.sched_setaffinity(0, {one})  # the server inherits it
        try:
            s = Server(exe).start()
        finally:
            os.sched_setaffinity(0, mine)
        cores = s.get_json("/devices")["devices"][0]["cores"]
        check(cores == 1, "a server on one CPU (taskset) divides %d cores among its jobs" % cores)
        check(s.stop() == 0, "exit status")
    print("test_config: ok (%d options)" % len(opts))


if __name__ == "__main__":
    main(sys.argv[1])
