"""test_diffusers_tar.py - GET /checkpoints/{id}?format=diffusers: a tar of a diffusers
DDPMPipeline folder (model_index.json, scheduler/scheduler_config.json, unet/config.json,
unet/diffusion_pytorch_model.safetensors) equal to what `ddpmd export --diffusers` writes for the
same checkpoint (the same JSON, the same tensors byte for byte, which are the checkpoint's EMA
weights under the model's own names). The tar is built once per checkpoint and streamed from a
cached file beside it (the same inode for a second request, no temporaries left), which goes
when the checkpoint is pruned; while one of an owner's exports is being built (its write held in
fsync by the stall_fsync shim) another of the same owner's is 503 with Retry-After, and nobody
reads a partial tar. An unknown format is 400. (test_diffusers_pipeline.py loads the tar in real
diffusers.) Usage: test_diffusers_tar.py PATH/TO/ddpmd
"""
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading

from serverlib import Server, check, need_fmnist, problem_ok, tiny, wait_for

FILES = ["model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
         "unet/diffusion_pytorch_model.safetensors"]


def tensors(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items()}, meta



def main(exe):
    need_fmnist()
    hold = os.path.join(tempfile.mkdtemp(prefix="ddpmd-hold-"), "release")
    shim = os.path.join(os.path.dirname(os.path.abspath(exe)), "libddpmd_stall_fsync.so")
    mark = hold + "-mark"
    asan = os.environ.get("ASAN_OPTIONS", "")
    # the job of the pruning check waits after step 2 until `hold` exists; export writes are
    # held in fsync (the first one only: the mark) until `hold + ".fsync"` exists
    env = {"DDPMD_TEST_HOLD_STEP": "2", "DDPMD_TEST_HOLD_FILE": hold,
           "LD_PRELOAD": shim, "STALL_FSYNC_MATCH": ".diffusers.tar.tmp.", "STALL_FSYNC_MARK": mark,
           "STALL_FSYNC_RELEASE": hold + ".fsync",
           "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
    check(os.path.exists(shim), "the shim %s is not built" % shim)
    s = Server(exe, env=env).start()
    jid = s.request("POST", "/train", tiny(steps=2, checkpoint_every=1, keep_last=3)).json()["id"]
    open(hold, "w").close()  # nothing held for this job: step 2 is its last
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="done")
    cid = "%s-2" % jid
    ckdir = os.path.join(s.data, "jobs", jid, "out", "checkpoints")
    cache = os.path.join(ckdir, "step-00000002.diffusers.tar")

    # the first build is held in its fsync: another export of the same owner is refused (503),
    # the same one too, and nothing half-written is served
    got = {}
    t = threading.Thread(target=lambda: got.update(r=s.request("GET", "/checkpoints/%s?format=diffusers" % cid, timeout=120)))
    t.start()
    wait_for(lambda: os.path.exists(mark) and os.path.getsize(mark) > 0, "the held export write")
    check(not os.path.exists(cache), "the cache is in place before its write completed")
    for other in (cid, "%s-1" % jid):
        r = s.request("GET", "/checkpoints/%s?format=diffusers" % other)
        problem_ok(r, 503)
        check(r.header("Retry-After"), "503 without Retry-After")
    open(hold + ".fsync", "w").close()
    t.join()
    r = got["r"]
    check(r.status == 200, "diffusers tar: %d %s" % (r.status, r.body[:300]))
    check(r.header("Content-Type") == "application/x-tar", "type %s" % r.header("Content-Type"))
    check("%s-diffusers.tar" % cid in (r.header("Content-Disposition") or ""), "disposition")
    check(os.path.exists(cache) and open(cache, "rb").read() == r.body, "no cache, or not the body")
    ino = os.stat(cache).st_ino
    leftovers = [f for f in os.listdir(ckdir) if ".tmp." in f or ".build-" in f]
    check(not leftovers, "temporaries left: %s" % leftovers)
    # built once: the second answer is the same file
    r2 = s.request("GET", "/checkpoints/%s?format=diffusers" % cid)
    check(r2.status == 200 and r2.body == r.body and os.stat(cache).st_ino == ino,
          "the second request did not reuse the cache")

    tf = tarfile.open(fileobj=io.BytesIO(r.body))
    names = sorted(m.name for m in tf.getmembers())
    check(names == sorted(FILES), "members %s" % names)
    check(all(m.isfile() for m in tf.getmembers()), "a member is no regular file")
    cfg = json.loads(tf.extractfile("unet/config.json").read())
    got_t, meta = tensors(tf.extractfile("unet/diffusion_pytorch_model.safetensors").read())
    index = json.loads(tf.extractfile("model_index.json").read())
    check(index["_class_name"] == "DDPMPipeline" and index["unet"] == ["diffusers", "UNet2DModel"]
          and index["scheduler"] == ["diffusers", "DDPMScheduler"], "model_index %s" % index)
    sched = json.loads(tf.extractfile("scheduler/scheduler_config.json").read())
    check(sched["_class_name"] == "DDPMScheduler" and sched["num_train_timesteps"] == 1000 and
          sched["beta_schedule"] == "linear" and sched["prediction_type"] == "epsilon" and
          sched["clip_sample"] is True and sched["variance_type"] == "fixed_small",
          "scheduler %s" % sched)

    # the CLI's export of the same checkpoint
    ckpt = os.path.join(ckdir, "step-00000002.safetensors")
    cli = os.path.join(s.data, "cli-export")
    p = subprocess.run([exe, "export", "--diffusers", cli, ckpt], capture_output=True, text=True)
    check(p.returncode == 0, "ddpmd export: %s" % p.stderr)
    for f in FILES[:3]:
        check(json.load(open(os.path.join(cli, f))) == json.loads(tf.extractfile(f).read()),
              "%s differs from the CLI's" % f)
    want, _ = tensors(open(os.path.join(cli, FILES[3]), "rb").read())
    check(sorted(got_t) == sorted(want), "tensor names differ: %s" % (set(got_t) ^ set(want)))
    check(all(got_t[k] == want[k] for k in want), "tensors differ from the CLI export")
    check(meta.get("format") == "pt", "metadata %s" % meta)
    # the EMA weights of the checkpoint, under their own names
    src, _ = tensors(open(ckpt, "rb").read())
    check(all(got_t[k] == src["ema." + k] for k in got_t), "not the checkpoint's EMA weights")
    check(any(k.startswith("down_blocks.") for k in got_t), "no diffusers names: %s" % sorted(got_t)[:5])
    m = tiny()["model"]
    check(cfg["_class_name"] == "UNet2DModel" and cfg["block_out_channels"] == m["block_out_channels"]
          and cfg["sample_size"] == m["image_size"] and cfg["in_channels"] == 1, "config %s" % cfg)

    problem_ok(s.request("GET", "/checkpoints/%s?format=zip" % cid), 400, "format")
    r = s.request("GET", "/checkpoints/%s?format=safetensors" % cid)
    check(r.status == 200 and r.body == open(ckpt, "rb").read(), "format=safetensors")
    problem_ok(s.request("GET", "/checkpoints/%s-9?format=diffusers" % jid), 404)

    # the cache goes with its checkpoint: a job held after its step 2 (its checkpoint exported),
    # then released to run on, keeping only its last checkpoint
    os.unlink(hold)
    j2 = s.request("POST", "/train", tiny(steps=4, checkpoint_every=1, keep_last=1)).json()["id"]
    s.wait_job(j2, lambda j: j["step"] == 2, what="held at step 2")
    ck2 = os.path.join(s.data, "jobs", j2, "out", "checkpoints")
    wait_for(lambda: os.path.exists(os.path.join(ck2, "step-00000002.safetensors")), "checkpoint 2")
    r = s.request("GET", "/checkpoints/%s-2?format=diffusers" % j2)
    check(r.status == 200, "export of the held job: %d %s" % (r.status, r.body[:200]))
    check(os.path.exists(os.path.join(ck2, "step-00000002.diffusers.tar")), "no cache for step 2")
    open(hold, "w").close()
    s.wait_job(j2, lambda j: j["state"] == "succeeded", what="the released job")
    left = sorted(os.listdir(ck2))
    check(left == ["step-00000004.safetensors"], "after pruning: %s" % left)
    check(s.stop() == 0, "exit status")
    print("test_diffusers_tar: ok (%d tensors, %d bytes)" % (len(got_t), len(r2.body)))


if __name__ == "__main__":
    main(sys.argv[1])
