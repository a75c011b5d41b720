"""test_diffusers_tar.py - GET /checkpoints/{id}?format=diffusers: a tar holding exactly
config.json and diffusion_pytorch_model.safetensors, equal to what `ddpmd export --diffusers`
writes for the same checkpoint (the same JSON, the same tensors byte for byte, which are the
checkpoint's EMA weights under the model's own names); the config describes the trained model
and diffusers' UNet2DModel loads it when diffusers is installed. An unknown format is 400; the
tar leaves no file behind in the job's folder. Usage: test_diffusers_tar.py PATH/TO/ddpmd
"""
import io
import json
import os
import struct
import subprocess
import sys
import tarfile

from serverlib import Server, check, need_fmnist, problem_ok, tiny


def tensors(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items()}, meta


def main(exe):
    need_fmnist()
    s = Server(exe).start()
    jid = s.request("POST", "/train", tiny(steps=2, checkpoint_every=0)).json()["id"]
    s.wait_job(jid, lambda j: j["state"] == "succeeded", what="done")
    cid = "%s-2" % jid
    before = sorted(os.listdir(os.path.join(s.data, "jobs", jid)))
    r = s.request("GET", "/checkpoints/%s?format=diffusers" % cid)
    check(r.status == 200, "diffusers tar: %d %s" % (r.status, r.body[:300]))
    check(r.header("Content-Type") == "application/x-tar", "type %s" % r.header("Content-Type"))
    check("%s-diffusers.tar" % cid in (r.header("Content-Disposition") or ""), "disposition")
    check(sorted(os.listdir(os.path.join(s.data, "jobs", jid))) == before,
          "the export left files in the job's folder")
    tf = tarfile.open(fileobj=io.BytesIO(r.body))
    names = sorted(m.name for m in tf.getmembers())
    check(names == ["config.json", "diffusion_pytorch_model.safetensors"], "members %s" % names)
    check(all(m.isfile() for m in tf.getmembers()), "a member is no regular file")
    cfg = json.loads(tf.extractfile("config.json").read())
    got, meta = tensors(tf.extractfile("diffusion_pytorch_model.safetensors").read())

    # the CLI's export of the same checkpoint
    ckpt = os.path.join(s.data, "jobs", jid, "out", "checkpoints", "step-00000002.safetensors")
    cli = os.path.join(s.data, "cli-export")
    p = subprocess.run([exe, "export", "--diffusers", cli, ckpt], capture_output=True, text=True)
    check(p.returncode == 0, "ddpmd export: %s" % p.stderr)
    check(json.load(open(os.path.join(cli, "config.json"))) == cfg, "config.json differs from the CLI's")
    want, _ = tensors(open(os.path.join(cli, "diffusion_pytorch_model.safetensors"), "rb").read())
    check(sorted(got) == sorted(want), "tensor names differ: %s" % (set(got) ^ set(want)))
    check(all(got[k] == want[k] for k in want), "tensors differ from the CLI export")
    check(meta.get("format") == "pt", "metadata %s" % meta)
    # the EMA weights of the checkpoint, under their own names
    src, _ = tensors(open(ckpt, "rb").read())
    check(all(got[k] == src["ema." + k] for k in got), "not the checkpoint's EMA weights")
    check(any(k.startswith("down_blocks.") for k in got), "no diffusers names: %s" % sorted(got)[:5])
    m = tiny()["model"]
    check(cfg["_class_name"] == "UNet2DModel" and cfg["block_out_channels"] == m["block_out_channels"]
          and cfg["sample_size"] == m["image_size"] and cfg["in_channels"] == 1, "config %s" % cfg)
    try:
        import diffusers  # noqa: F401 (Debian has no package; checked where pip installed it)
        d = os.path.join(s.data, "tar-export")
        tf.extractall(d)
        diffusers.UNet2DModel.from_pretrained(d)
    except ImportError:
        pass

    problem_ok(s.request("GET", "/checkpoints/%s?format=zip" % cid), 400, "format")
    r = s.request("GET", "/checkpoints/%s?format=safetensors" % cid)
    check(r.status == 200 and r.body == open(ckpt, "rb").read(), "format=safetensors")
    problem_ok(s.request("GET", "/checkpoints/%s-9?format=diffusers" % jid), 404)
    check(s.stop() == 0, "exit status")
    print("test_diffusers_tar: ok (%d tensors)" % len(got))


if __name__ == "__main__":
    main(sys.argv[1])
