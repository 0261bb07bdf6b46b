#!/usr/bin/env python3
"""The plan's bytes by op kind against what the kernels touched (docs/plan.md, "By op kind").

  footprint_check.py LAUNCH_LOG FOOTPRINT PLAN_JSON [--step N] [--tol T]

LAUNCH_LOG: an emulated run's MT_CUDA_LAUNCH_LOG (CUDA graphs off: one line a launch, each
with "op KIND ENTRY", the table entry it ran in and the kind the profile files it under);
FOOTPRINT: the same run's MT_EMU_FOOTPRINT ("NAME READ_BYTES WRITE_BYTES" a launch, in launch
order: the distinct 32-byte sectors each launch read and wrote); PLAN_JSON: `meshtrain plan
--json --profile P` of the same config and knobs (cost.by_kind.bytes).

Within step N (default: the last step of the log) each launch's footprint, each memset's
bytes and each device copy's read and write are added to its kind, and set next to the plan's
bytes of that kind. Fails when
  - the two files disagree on the launches (count or names: a graph replayed, a log cut);
  - anything in the step ran outside a table entry (kind "-": the plan cannot price it);
  - a kind the plan prices by its bytes (norm, elementwise, xent, optimizer; the scan, whose
    bytes decide its time at the benchmarks' shapes) is off the plan by more than T (default
    0.15) relative, either way, or has bytes the plan has none of.
The footprint counts each sector once a launch: what the launch must move at the least (DRAM's
floor when its data is not in the L2), the traffic the plan prices a memory-bound kind at.
GEMMs (cuBLAS: not instrumented) and attention are priced by FLOPs: listed, not judged.
Prints the table and each kind's largest kernels.
"""
import collections
import json
import sys

JUDGED = ("norm", "elementwise", "xent", "optimizer", "scan")
PLAN_KIND = {"attention": "attention_fwd"}   # the profile's names where the plan's differ


def read(log_path, foot_path, step):
    foot = [line.split() for line in open(foot_path) if line.strip()]
    launches, cur, i = [], None, 0
    per, kern = collections.defaultdict(float), collections.defaultdict(float)
    steps = []
    for line in open(log_path):
        w = line.split()
        if not w:
            continue
        if w[0] == "step":
            cur = int(w[1]) if w[2] == "begin" else None
            if cur is not None:
                steps.append(cur)
            continue
        kind = w[w.index("op") + 1] if "op" in w else "-"
        entry = w[w.index("op") + 2] if "op" in w else "-"
        if w[0] == "launch":
            if i >= len(foot) or foot[i][0] != w[1]:
                raise SystemExit("FAIL: launch %d: the log has %s, the footprint %s (CUDA graphs on? the files cut?)"
                                 % (i, w[1], foot[i][0] if i < len(foot) else "nothing"))
            b = int(foot[i][1]) + int(foot[i][2])
            i += 1
            launches.append(cur)
            if cur == step:
                per[kind] += b
                kern[(kind, w[1], entry)] += b
        elif cur == step and w[0] in ("memset", "copy"):
            b = int(w[1]) if w[0] == "memset" else 2 * int(w[2]) if w[1] == "d2d" else 0
            per[kind] += b
            if b:
                kern[(kind, w[0] + ("" if w[0] == "memset" else " " + w[1]), entry)] += b
    if i != len(foot):
        raise SystemExit("FAIL: the footprint has %d launches, the log %d" % (len(foot), i))
    return per, kern, steps


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    step = int(argv[argv.index("--step") + 1]) if "--step" in argv else None
    tol = float(argv[argv.index("--tol") + 1]) if "--tol" in argv else 0.15
    if step is None:
        steps = [int(line.split()[1]) for line in open(argv[0]) if line.startswith("step ") and "begin" in line]
        if not steps:
            print("FAIL: no step marks in %s" % argv[0])
            return 1
        step = steps[-1]
    per, kern, _ = read(argv[0], argv[1], step)
    plan = json.load(open(argv[2]))["cost"]["by_kind"]["bytes"]
    err = []
    print("   step %d: bytes by kind, kernels' footprint vs the plan (tolerance %.0f%% on %s)"
          % (step, 100 * tol, ", ".join(JUDGED)))
    kinds = sorted(set(PLAN_KIND.get(k, k) for k in per) | set(k for k in plan if plan[k] > 0))
    for k in kinds:
        got = sum(v for kk, v in per.items() if PLAN_KIND.get(kk, kk) == k)
        want = plan.get(k, 0.0)
        ratio = got / want if want > 0 else float("inf") if got > 0 else 1.0
        judged = k in JUDGED
        mark = ""
        if k == "-" and got == 0:
            continue
        if k == "-":
            err.append("%.0f bytes in the step ran outside any table entry (kind '-')" % got)
            mark = "  <- outside the table"
        elif judged and abs(ratio - 1) > tol:
            err.append("%s: the kernels touched %.4g B, the plan prices %.4g B (x%.3f)" % (k, got, want, ratio))
            mark = "  <- off"
        print("   %-14s %12.4g B  plan %12.4g B  x%-7.3f %s%s" % (k, got, want, ratio, "" if judged else "(not judged)",
                                                                  mark))
    for k in kinds:
        top = sorted(((v, n, e) for (kk, n, e), v in kern.items() if PLAN_KIND.get(kk, kk) == k), reverse=True)[:3]
        if top:
            print("     %-12s %s" % (k, "; ".join("%s (%s) %.3g B" % (n, e, v) for v, n, e in top)))
    for e in err:
        print("FAIL:", e)
    return 1 if err else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
