"""test_restart_exact.py - a served job interrupted four ways ends with the same weights as an
uninterrupted run, bit for bit: SIGTERM during training, kill -9 during a checkpoint write,
SIGTERM during a checkpoint write, kill -9 during training, then a last start that runs it to its
end. The write window is made observable by an LD_PRELOAD shim (stall_fsync.c, built next to the
binary; no test code in ddpmd) that holds the fsync of a checkpoint's temporary file. Every tensor
of the final checkpoint (downloaded through GET /checkpoints/{id}: weights, EMA, AdamW moments)
is compared byte for byte with `ddpmd train` run straight through on the job's own spec.json.
No step depends on how fast a step is: the starts that are interrupted during training are held
at a step by the test-only knob DDPMD_TEST_HOLD_STEP/DDPMD_TEST_HOLD_FILE (server/testhold.h),
so the job cannot finish before the kill however fast the machine (it used to on a fast one).
Usage: test_restart_exact.py PATH/TO/ddpmd
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

from serverlib import Server, check, job_processes, need_fmnist, tiny

STEPS = 14


def tensors(blob):
    """safetensors bytes -> ({name: (dtype, shape, raw bytes)}, metadata)"""
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = blob[8 + n:]
    out = {}
    for name, t in head.items():
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[a:b])
    return out, meta


def wait_file(path, srv, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return open(path).read()
        check(srv.proc.poll() is None, "the server exited while waiting for %s" % path)
        time.sleep(0.02)
    check(False, "%s did not appear: no checkpoint write was held" % path)


def kill9(srv):
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    deadline = time.time() + 10
    while job_processes(srv.data) and time.time() < deadline:
        time.sleep(0.05)
    check(job_processes(srv.data) == [], "a job process outlived kill -9 of the server")


def main(exe):
    need_fmnist()
    shim = os.path.join(os.path.dirname(os.path.abspath(exe)), "libddpmd_stall_fsync.so")
    check(os.path.exists(shim), "the shim %s is not built" % shim)
    spec = tiny(steps=STEPS, checkpoint_every=2, keep_last=3, seed=7)
    # dropout and flips are random draws too: they must repeat after every resume
    spec["model"].update(block_out_channels=[16, 32], attention_resolutions=[16],
                         norm_num_groups=8, dropout=0.1)
    spec["data"]["flip"] = True

    asan = os.environ.get("ASAN_OPTIONS", "")
    def held(mark, secs):
        # the shim precedes the sanitizer runtime in the ASan build: tell it that is intended
        return {"LD_PRELOAD": shim, "STALL_FSYNC_MATCH": ".safetensors.tmp.",
                "STALL_FSYNC_MARK": mark, "STALL_FSYNC_SECONDS": str(secs),
                "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}

    def hold(step, env=None):
        # the job waits after this step until the (never made) release file appears
        e = dict(env or {})
        e.update(DDPMD_TEST_HOLD_STEP=str(step), DDPMD_TEST_HOLD_FILE="/nonexistent/ddpmd-release")
        return e

    # (a) SIGTERM during training: the job stops at its next step with a checkpoint
    s1 = Server(exe, env=hold(5)).start()
    data = s1.data
    r = s1.request("POST", "/train", spec)
    check(r.status == 202, "POST /train: %d %s" % (r.status, r.body[:300]))
    jid = r.json()["id"]
    s1.wait_job(jid, lambda j: j["step"] >= 3, what="step 3")
    check(s1.stop(signal.SIGTERM) == 0, "(a) SIGTERM: exit status")
    check(job_processes(data) == [], "(a) a job process outlived the server")
    ckdir = os.path.join(data, "jobs", jid, "out", "checkpoints")

    # (b) kill -9 while a checkpoint's temporary is being written (held in its fsync)
    mark_b = os.path.join(data, "held-b")
    s2 = Server(exe, data=data, env=held(mark_b, 3600)).start()
    s2.own_data = False
    tmp_b = wait_file(mark_b, s2)
    check(".safetensors.tmp." in tmp_b and os.path.exists(tmp_b),
          "(b) the held write's temporary %s" % tmp_b)
    kill9(s2)
    check(os.path.exists(tmp_b), "(b) the half-written temporary is gone before the restart")

    # (c) SIGTERM while a checkpoint write is held for 2 s: the write completes, the job stops
    mark_c = os.path.join(data, "held-c")
    s3 = Server(exe, data=data, env=held(mark_c, 5)).start()
    s3.own_data = False
    tmp_c = wait_file(mark_c, s3)
    final_c = tmp_c[:tmp_c.index(".tmp.")]
    check(s3.stop(signal.SIGTERM) == 0, "(c) SIGTERM during a checkpoint write: exit status")
    check(job_processes(data) == [], "(c) a job process outlived the server")
    check(os.path.exists(final_c) and not os.path.exists(tmp_c),
          "(c) the held checkpoint %s was not completed" % os.path.basename(final_c))

    # (d) kill -9 during training, past the last checkpoint: held 3 steps on, before its end
    at = max(int(f.split("-")[1].split(".")[0]) for f in os.listdir(ckdir)
             if f.endswith(".safetensors"))
    check(at + 3 < STEPS, "(d) resumes at %d: no room for 3 more steps before %d" % (at, STEPS))
    s4 = Server(exe, data=data, env=hold(at + 3)).start()
    s4.own_data = False
    s4.wait_job(jid, lambda j: j["step"] == at + 3, what="3 more steps")
    kill9(s4)

    # the last start runs it to its end
    s5 = Server(exe, data=data).start()
    s5.own_data = False
    evs, _ = s5.events(jid, timeout=180)
    j = s5.get_json("/jobs/" + jid)
    check(j["state"] == "succeeded" and j["step"] == STEPS, "final job %s" % j)
    running = [e[2] for e in evs if e[1] == "state" and e[2]["state"] == "running"]
    check(len(running) == 5, "five starts: %s" % running)
    froms = [x.get("resumed_from_step", 0) for x in running]
    check(froms[0] == 0 and all(f > 0 for f in froms[1:]), "resumed from %s" % froms)
    step_b = int(os.path.basename(tmp_b).split("-")[1].split(".")[0])
    check(froms[2] < step_b, "(b) the start after the killed write resumed at %d, not before %d"
          % (froms[2], step_b))
    r = s5.request("GET", "/checkpoints/%s-%d" % (jid, STEPS))
    check(r.status == 200, "GET the final checkpoint: %d" % r.status)
    got, meta = tensors(r.body)

    # the uninterrupted run of the same spec.json, the same code
    ref = os.path.join(data, "reference")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([exe, "train", os.path.join(data, "jobs", jid, "spec.json"), "--out", ref],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=300)
    check(p.returncode == 0, "the reference run: %d %s" % (p.returncode, p.stderr[-500:]))
    want, meta_ref = tensors(open(os.path.join(ref, "checkpoints", "step-%08d.safetensors"
                                               % STEPS), "rb").read())
    check(sorted(got) == sorted(want), "tensor names differ: %s" % (set(got) ^ set(want)))
    check(any(n.startswith("ema.") for n in want) and any(n.startswith("adam_m.") for n in want),
          "no EMA or AdamW state among %s" % sorted(want)[:8])
    diff = [n for n in want if got[n] != want[n]]
    check(not diff, "%d of %d tensors differ from the uninterrupted run, e.g. %s"
          % (len(diff), len(want), diff[:5]))
    check(meta.get("step") == meta_ref.get("step") == str(STEPS), "metadata step %s %s"
          % (meta.get("step"), meta_ref.get("step")))
    check(s5.stop() == 0, "exit status")
    print("test_restart_exact: ok (%d tensors equal after 4 interruptions, resumed from %s)"
          % (len(want), froms[1:]))


if __name__ == "__main__":
    main(sys.argv[1])
