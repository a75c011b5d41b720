#!/usr/bin/python3
"""Validates examples/*.json against components/schemas/TrainSpec of openapi.yaml, and checks
that the schema rejects what the C parser rejects (unknown fields, wrong types, bad ranges).
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
}
for name, mutate in bad.items():
    doc = json.loads(json.dumps(base))
    mutate(doc)
    check(not validator.is_valid(doc), f"schema accepts: {name}")

print(f"check_examples: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
