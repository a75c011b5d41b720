#!/usr/bin/python3
"""Validates examples/*.json against components/schemas/TrainSpec of openapi.yaml, and checks
that the schema rejects what the C parser rejects (unknown fields, wrong types, bad ranges,
values that do not survive being stored: seeds above 2^53 - 1, floats that round to 0 or 1).
Prints 'N passed, N failed'; exits non-zero on any failure."""
import glob
import json
import os
import sys

import jsonschema
import yaml

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
with open(os.path.join(root, "openapi.yaml")) as f:
    api = yaml.safe_load(f)
schemas = api["components"]["schemas"]
# resolve '#/components/schemas/X' references against the whole document
resolver = jsonschema.RefResolver("", api)
validator = jsonschema.Draft202012Validator(schemas["TrainSpec"], resolver=resolver)

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


examples = sorted(glob.glob(os.path.join(root, "examples", "*.json")))
check(len(examples) >= 3, "at least three examples")
for path in examples:
    with open(path) as f:
        doc = json.load(f)
    errors = list(validator.iter_errors(doc))
    check(not errors, f"{os.path.basename(path)}: {[e.message for e in errors]}")

with open(os.path.join(root, "examples", "fmnist-tiny.json")) as f:
    base = json.load(f)
bad = {
    "unknown top-level field": lambda d: d.update(trian={}),
    "unknown train field": lambda d: d["train"].update(bacth=4),
    "batch as string": lambda d: d["train"].update(batch="8"),
    "batch zero": lambda d: d["train"].update(batch=0),
    "negative lr": lambda d: d["train"].update(lr=-1),
    "bad schedule": lambda d: d["train"].update(lr_schedule="step"),
    "missing dataset": lambda d: d["data"].pop("dataset"),
    "unknown preset": lambda d: d["model"].update(preset="vit"),
    "seed field on ddpm": lambda d: d["model"].update(base=64),
    # what the C parser refuses because of how the value is stored (spec.c's rule table)
    "seed 2^53 (2^53 + 1 reads as it)": lambda d: d["train"].update(seed=2**53),
    "beta2 that rounds to 1.0f": lambda d: d["train"].update(beta2=0.99999999),
    "lr that is 0 as a float": lambda d: d["train"].update(lr=1e-50),
    "eps below the smallest normal float": lambda d: d["train"].update(eps=1e-40),
    "norm_eps that is 0 as a float": lambda d: d["model"].update(norm_eps=1e-50),
    "clip beyond 1e6": lambda d: d["train"].update(clip=1e300),
    "warmup beyond 1e8": lambda d: d["train"].update(warmup=10**9),
    "threads 100000": lambda d: d["train"].update(threads=100000),
    "norm_num_groups 0": lambda d: d["model"].update(norm_num_groups=0),
    "layers_per_block 40": lambda d: d["model"].update(layers_per_block=40),
    "channels 2e9": lambda d: d["model"].update(block_out_channels=[2000000000]),
    "attention_head_dim 5000": lambda d: d["model"].update(attention_head_dim=5000),
    "NUL in dataset": lambda d: d["data"].update(dataset="fashion-mnist\u0000/etc"),
    "NUL in init_from": lambda d: d.update(init_from="a\u0000b"),
    "log_every beyond 1e8": lambda d: d["output"].update(log_every=10**9),
    # the memory object (spec.c parse_memory)
    "unknown memory field": lambda d: d.update(memory={"budget": 1}),
    "budget with an exponent": lambda d: d.update(memory={"vram_budget": "1e9"}),
    "budget with a space": lambda d: d.update(memory={"vram_budget": "4 GiB"}),
    "negative budget": lambda d: d.update(memory={"vram_budget": -1}),
    "precision f64": lambda d: d.update(memory={"precision": "f64"}),
    "offload true": lambda d: d.update(memory={"offload": True}),
    "micro_batch half": lambda d: d.update(memory={"micro_batch": "half"}),
    "loss_scale growth 1": lambda d: d.update(memory={"loss_scale": {"growth": 1}}),
    "deterministic as a string": lambda d: d.update(memory={"deterministic": "yes"}),
}
for name, mutate in bad.items():
    doc = json.loads(json.dumps(base))
    mutate(doc)
    check(not validator.is_valid(doc), f"schema accepts: {name}")

# the edges the C parser accepts, the schema accepts too
good = {
    "seed 2^53 - 1": lambda d: d["train"].update(seed=2**53 - 1),
    "beta2 0.9999999": lambda d: d["train"].update(beta2=0.9999999),
    "eps at the smallest normal float": lambda d: d["train"].update(eps=1.1754943508222875e-38),
    "clip 1e6": lambda d: d["train"].update(clip=1000000),
    "attention_head_dim null": lambda d: d["model"].update(attention_head_dim=None),
    "memory as spec_to_json writes it": lambda d: d.update(memory={
        "vram_budget": 0, "precision": "auto", "micro_batch": "auto", "recompute": "auto",
        "offload": "auto", "deterministic": False,
        "loss_scale": {"initial": 65536, "growth": 2, "backoff": 0.5, "growth_interval": 2000}}),
    "memory forced": lambda d: d.update(memory={
        "vram_budget": "512MiB", "precision": "f32", "micro_batch": 2, "recompute": "none",
        "offload": "off", "deterministic": True}),
}
for name, mutate in good.items():
    doc = json.loads(json.dumps(base))
    mutate(doc)
    errors = list(validator.iter_errors(doc))
    check(not errors, f"schema refuses: {name}: {[e.message for e in errors]}")

print(f"check_examples: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
