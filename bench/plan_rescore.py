#!/usr/bin/env python3
"""plan_rescore.py - the planner's picks under other cost models, scored against the steps an
earlier bench/plan.sh run measured (its raw `cand` and `cell` lines), without measuring again:
for each cost model file (bench/calibrate's format; "default" for the compiled-in constants),
`ddpmd plan --all --json` predicts every candidate of each measured cell; the pick is the
fastest predicted candidate that fits the cell's budget (f32 first, as the search does), and
its measured seconds are compared with the fastest measured fitting candidate.
  python3 bench/plan_rescore.py RAW_DIR [default|MODEL_FILE ...] [--ddpmd build/ddpmd]
(from the repository's root; RAW_DIR is plan.sh's OUT). Candidates are matched by precision,
micro-batch, recompute and offload: the grid chunk changes no training step, so a strategy's
measured seconds are the least over its grid chunks. Not a test.
"""
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def read_raw(folder):
    """the cell and cand records (dicts) of plan_bench's lines in folder's *.txt files; also
    what bench/plan.sh's tables are made from"""
    rec = lambda line: dict(kv.split("=", 1) for kv in shlex.split(line)[1:])
    cells, cands = [], []
    for f in sorted(glob.glob(os.path.join(folder, "*.txt"))):
        for line in open(f):
            if line.startswith("cell "):
                cells.append(rec(line))
            elif line.startswith("cand "):
                cands.append(rec(line))
    return cells, cands


def key_of_text(s):
    """("f32", micro, recompute, offload) of plan_bench's strategy text"""
    parts = [p.strip() for p in s.split(",")]
    prec = parts[0]
    micro = parts[1].split()[1]  # "micro-batch 8 (the whole batch)": "8"
    recompute = parts[2].split()[1]
    offload = parts[3].split()[1]
    return prec, micro, recompute, offload


def predictions(ddpmd, spec, batch, model, budget):
    """every candidate of spec at batch under model and budget: [(key, predicted s, fits)] and
    the search's pick (its key), or None"""
    with open(os.path.join("examples", spec)) as f:
        j = json.load(f)
    j["train"]["batch"] = int(batch)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(j, f)
        path = f.name
    env = dict(os.environ)
    env.pop("DDPMD_COST_MODEL", None)
    if model != "default":
        env["DDPMD_COST_MODEL"] = model
    try:
        out = subprocess.run([ddpmd, "plan", path, "--all", "--json", "--vram-budget",
                              "%d" % budget], env=env, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    res, pick = [], None
    for c in json.loads(out)["candidates"]:
        if not c["planned"] or c["failed"]:
            continue
        k = (c["precision"], str(c["micro_batch"]), c["recompute"], c["offload"])
        res.append((k, c["predicted_step_seconds"], c["fits"]))
        if c["chosen"]:
            pick = k
    return res, pick


def main():
    args = sys.argv[1:]
    ddpmd = "build/ddpmd"
    if "--ddpmd" in args:
        i = args.index("--ddpmd")
        ddpmd = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    raw, models = args[0], args[1:] or ["default"]
    cells, cands = read_raw(raw)
    # measured: (spec, batch) -> key -> least cpu seconds
    measured = {}
    for c in cands:
        k = key_of_text(c["strategy"])
        d = measured.setdefault((c["spec"], c["batch"]), {})
        d[k] = min(d.get(k, float("inf")), float(c["cpu"]))
    for c in cells:  # a remeasured pick or fastest is only in its cell line
        if "cpu" in c and "pick" in c:
            d = measured.setdefault((c["spec"], c["batch"]), {})
            for s, t in ((c["pick"], c["cpu"]), (c["fastest"], c["fastest_cpu"])):
                k = key_of_text(s)
                d[k] = min(d.get(k, float("inf")), float(t))


    for model in models:
        errs, picks, within = [], [], []
        lines = []
        for (spec, batch), meas in sorted(measured.items()):
            if len(meas) < 2:
                continue
            budgets = sorted({float(c["budget"]) for c in cells
                              if c["spec"] == spec and c["batch"] == batch})
            seen = set()
            for b in budgets:
                pred, pick = predictions(ddpmd, spec, batch, model, b)
                for k, p, _ in pred:
                    if k in meas and k not in seen:  # each strategy's error once
                        seen.add(k)
                        errs.append(abs(p - meas[k]) / meas[k])
                half = pick is not None and pick[0] != "f32"
                mfit = {k: meas[k] for k, p, fits in pred
                        if fits and k in meas and (k[0] != "f32") == half}
                if pick is None or pick not in meas or len(mfit) < 2:
                    continue
                p = [p for k, p, _ in pred if k == pick][0]
                fastest = min(mfit.values())
                picks.append(abs(p - meas[pick]) / meas[pick])
                ok = meas[pick] <= 1.10 * fastest
                within.append(ok)
                lines.append("  %-18s b%-3s %8.1f MiB: pick %-28s %.4f s measured (pred %.4f), fastest "
                             "%.4f s: %s" % (spec, batch, b / 1048576, "/".join(pick), meas[pick], p,
                                             fastest, "within 10%" if ok else
                                             "%+.0f%%" % (100 * (meas[pick] / fastest - 1))))
        print("cost model %s:" % model)
        print("\n".join(lines))
        if errs:
            print("  every measured candidate: %d, |error| median %.1f%%, worst %.1f%%; picks: %d, "
                  "|error| median %.1f%%, worst %.1f%%; within 10%% of the fastest in %d of %d cells"
                  % (len(errs), 100 * statistics.median(errs), 100 * max(errs), len(picks),
                     100 * statistics.median(picks), 100 * max(picks), sum(within), len(within)))


if __name__ == "__main__":
    main()
