"""test_diffusers_pipeline.py - the diffusers export (GET /checkpoints/{id}?format=diffusers) in
real diffusers: DDPMPipeline.from_pretrained loads the extracted tar (model_index.json,
scheduler/scheduler_config.json, unet/), its DDPMScheduler carries the job's diffusion (linear
betas from 0.0002 to 0.03 over 100 timesteps with epsilon prediction for one job, cosine betas
over 60 with v prediction for another), and it samples the same images as `ddpmd sample` of the same checkpoint from the same
noise - DDIM with eta 0 from the same x_T, and DDPM ancestral through DDPMPipeline itself with
its randn_tensor fed ddpmd's Philox draws (x_T and each step's noise, kernels/philox.h redone in
numpy).

Tolerance: both sides run in float32 (torch's CPU convolutions against oneDNN's), so x_0 agree
to about 1e-5 and ddpmd's images are 8-bit PNGs; diffusers' result is quantised the same way
(image.c: floor((x + 1) * 127.5 + 0.5)), and a value within rounding of a level boundary may
land one level apart: every pixel within 1 level and at most 1% of them off by one. A wrong
beta, timestep, prediction type, clip or variance moves pixels by tens of levels.

diffusers comes from the package index into a venv of its own beside the binary
(BUILD/diffusers-venv, made once, --system-site-packages for Debian's python3-torch 1.13, which
diffusers 0.27.2 runs on); the test skips (77) only when the index cannot be reached.
Usage: test_diffusers_pipeline.py PATH/TO/ddpmd
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PINS = ["diffusers==0.27.2", "huggingface_hub==0.23.5"]


def venv_python(exe):
    """the venv's python, made (and diffusers installed) when missing; exits 77 without the index"""
    venv = os.path.join(os.path.dirname(os.path.abspath(exe)), "diffusers-venv")
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "ddpmd-pins")
    if os.path.exists(stamp) and open(stamp).read() == " ".join(PINS):
        return py
    tmp = venv + ".tmp-%d" % os.getpid()
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", tmp], check=True)
    pip = [os.path.join(tmp, "bin", "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    p = subprocess.run(pip + ["install", "--only-binary=:all:"] + PINS, capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        q = subprocess.run(pip + ["index", "versions", "diffusers"], capture_output=True, text=True,
                           timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
        if q.returncode != 0:
            print("SKIP: the Python package index cannot be reached to install diffusers: %s"
                  % (q.stderr.strip().splitlines() or ["?"])[-1])
            sys.exit(77)
        print("FAIL: pip install %s: %s" % (" ".join(PINS), p.stderr[-1500:]))
        sys.exit(1)
    with open(os.path.join(tmp, "ddpmd-pins"), "w") as f:
        f.write(" ".join(PINS))
    # used as BUILD/diffusers-venv/bin/python -m ..., which does not depend on the folder's name
    shutil.rmtree(venv, ignore_errors=True)
    os.rename(tmp, venv)
    return py


def philox_normal(np, seed, tag, step, sample, n):
    """kernels/philox.h philox_normal(seed, tag, step, sample, op 0, e) for e in [0, n)"""
    M = np.uint64(0xFFFFFFFF)
    e = np.arange(n, dtype=np.uint64)
    c0 = e >> np.uint64(2)
    c1 = np.full(n, sample & 0xFFFF, dtype=np.uint64)
    c2 = np.full(n, step & 0xFFFFFFFF, dtype=np.uint64)
    c3 = np.full(n, ((step >> 32) & 0xFFFFFF) | (tag << 24), dtype=np.uint64)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & M,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M)
        k0 = (k0 + np.uint64(0x9E3779B9)) & M
        k1 = (k1 + np.uint64(0xBB67AE85)) & M
    pair = (e >> np.uint64(1)) & np.uint64(1)
    a = np.where(pair == 1, c2, c0)
    b = np.where(pair == 1, c3, c1)

    def uniform(u):
        return ((u >> np.uint64(9)).astype(np.float32) * np.float32(1.1920928955078125e-07)
                + np.float32(5.9604644775390625e-08))
    u1, u2 = uniform(a), uniform(b)
    r = np.sqrt(np.float32(-2.0) * np.log(u1)).astype(np.float32)
    th = (np.float32(6.2831853071795864769) * u2).astype(np.float32)
    z = np.where((e & np.uint64(1)) == 1, r * np.sin(th), r * np.cos(th))
    return z.astype(np.float32)


def quantise(np, x):
    """image.c img_quantise of values in [-1, 1]"""
    q = np.floor((x.astype(np.float32) + np.float32(1)) * np.float32(127.5) + np.float32(0.5))
    return np.clip(q, 0, 255).astype(np.int32)


def main(exe):
    import numpy as np
    import safetensors.torch  # noqa: F401 (diffusers 0.27 calls safetensors.torch unimported)
    import torch
    from PIL import Image
    from diffusers import DDIMScheduler, DDPMPipeline, DDPMScheduler
    import diffusers.pipelines.ddpm.pipeline_ddpm as pipe_mod
    import diffusers.schedulers.scheduling_ddpm as sched_mod
    from serverlib import Server, check, need_fmnist, tiny

    need_fmnist()
    torch.set_num_threads(1)
    s = Server(exe).start()
    jobs = {}
    # few timesteps: ddpmd's DDPM sampler takes every one of them
    for name, diffusion in [("linear-eps", {"timesteps": 100, "beta_schedule": "linear",
                                            "beta_start": 0.0002, "beta_end": 0.03,
                                            "prediction": "epsilon"}),
                            ("cosine-v", {"timesteps": 60, "beta_schedule": "cosine",
                                          "prediction": "v_prediction"})]:
        spec = tiny(steps=3, checkpoint_every=0)
        spec["diffusion"] = diffusion
        r = s.request("POST", "/train", spec)
        check(r.status == 202, "POST /train %s: %d %s" % (name, r.status, r.body[:300]))
        jobs[name] = (r.json()["id"], diffusion)
    work = tempfile.mkdtemp(prefix="ddpmd-diffusers-")
    seed, n, steps = 5, 2, 10
    worst = []
    for name, (jid, diffusion) in jobs.items():
        s.wait_job(jid, lambda j: j["state"] == "succeeded", what=name)
        r = s.request("GET", "/checkpoints/%s-3?format=diffusers" % jid)
        check(r.status == 200, "diffusers tar of %s: %d %s" % (name, r.status, r.body[:300]))
        d = os.path.join(work, name)
        tarfile.open(fileobj=io.BytesIO(r.body)).extractall(d)
        pipe = DDPMPipeline.from_pretrained(d)
        pipe.set_progress_bar_config(disable=True)
        check(isinstance(pipe.scheduler, DDPMScheduler), "scheduler %s" % type(pipe.scheduler))
        cfg = pipe.scheduler.config
        want_T = diffusion["timesteps"]
        check(cfg.num_train_timesteps == want_T and cfg.clip_sample and
              cfg.prediction_type == {"epsilon": "epsilon", "v_prediction": "v_prediction"}[
                  diffusion["prediction"]] and
              cfg.beta_schedule == {"linear": "linear", "cosine": "squaredcos_cap_v2"}[
                  diffusion["beta_schedule"]], "scheduler config %s" % dict(cfg))
        if diffusion["beta_schedule"] == "linear":
            check(abs(cfg.beta_start - 0.0002) < 1e-12 and abs(cfg.beta_end - 0.03) < 1e-12,
                  "betas %s %s" % (cfg.beta_start, cfg.beta_end))
        unet = pipe.unet.eval()
        C, S = unet.config.in_channels, unet.config.sample_size
        per = C * S * S
        xT = np.stack([philox_normal(np, seed, 6, 0, i, per).reshape(C, S, S) for i in range(n)])
        ckpt = os.path.join(s.data, "jobs", jid, "out", "checkpoints", "step-00000003.safetensors")

        def ddpmd(sampler):
            out = os.path.join(work, "%s-%s" % (name, sampler))
            p = subprocess.run([exe, "sample", ckpt, "--sampler", sampler, "--eta", "0", "--steps",
                                str(steps if sampler == "ddim" else want_T), "--n", str(n), "--seed", str(seed), "--threads", "1",
                                "--out", out + ".png", "--each", out],
                               capture_output=True, text=True, timeout=300)
            check(p.returncode == 0, "ddpmd sample %s: %s" % (sampler, p.stderr[-500:]))
            imgs = [np.asarray(Image.open(os.path.join(out, "%04d.png" % i))) for i in range(n)]
            a = np.stack(imgs).astype(np.int32)
            return a.reshape(n, S, S, C).transpose(0, 3, 1, 2) if a.ndim == 4 else a[:, None]

        def compare(what, ours, theirs):
            diff = np.abs(ours - theirs)
            off = float((diff > 0).mean())
            worst.append("%s %s: max %d, %.2f%% off by one" % (name, what, diff.max(), 100 * off))
            check(diff.max() <= 1 and off <= 0.01,
                  "%s %s: ddpmd and diffusers differ by up to %d levels, %.2f%% of pixels"
                  % (name, what, diff.max(), 100 * off))

        # DDIM, eta 0, from ddpmd's x_T (the exported config, DDIM's defaults otherwise)
        ddim = DDIMScheduler.from_config(cfg)
        ddim.set_timesteps(steps)
        x = torch.from_numpy(xT.copy())
        with torch.no_grad():
            for t in ddim.timesteps:
                x = ddim.step(unet(x, t).sample, t, x, eta=0.0).prev_sample
        compare("DDIM eta 0", ddpmd("ddim"), quantise(np, x.numpy()))

        # DDPMPipeline itself over every timestep (ddpmd's DDPM sampler takes them all): its
        # randn_tensor gives ddpmd's x_T, then step k's noise
        calls = []

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            k = len(calls)
            calls.append(tuple(shape))
            check(tuple(shape) == (n, C, S, S), "randn_tensor of shape %s" % (tuple(shape),))
            z = xT if k == 0 else np.stack([philox_normal(np, seed, 6, k, i, per).reshape(C, S, S)
                                            for i in range(n)])
            return torch.from_numpy(z.copy())
        pipe_mod.randn_tensor, sched_mod.randn_tensor = randn, randn
        with torch.no_grad():
            img = pipe(batch_size=n, num_inference_steps=want_T, output_type="np").images
        check(len(calls) == want_T, "%d noise draws for %d steps" % (len(calls), want_T))
        theirs = quantise(np, img.transpose(0, 3, 1, 2) * 2 - 1)
        compare("DDPM ancestral", ddpmd("ddpm"), theirs)
    check(s.stop() == 0, "exit status")
    shutil.rmtree(work, ignore_errors=True)
    print("test_diffusers_pipeline: ok (diffusers %s, torch %s; %s)"
          % (__import__("diffusers").__version__, torch.__version__, "; ".join(worst)))


if __name__ == "__main__":
    exe = sys.argv[1]
    py = venv_python(exe)
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(py))):
        os.execv(py, [py, os.path.abspath(__file__), exe])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(exe)
