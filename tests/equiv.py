#!/usr/bin/env python3
"""equiv.py REF RUN [--skip N] [--bit [--fp64-sums]] [--tol T] [--no-params]

Does training run RUN equal the reference run REF (usually one rank)? Both are
--out directories: receipt.json and ckpt/step_NNNNNN/ (the trainer always
saves at its last step; params.bin holds FULL global fp32 tensors at the
offsets in manifest.json, whatever the mesh that saved them).

Compared, each on its own (a term buried in a sum can hide a 1.5% error):
  losses, lm_losses, aux_losses, z_losses   per step, relative
  grad_norms                                per step, relative
  every tensor of the final params.bin      max |a-b| per element (and / max|a|)
REF's series are read from step N on (--skip N: RUN resumed at step N).

--bit    : everything bit-identical (the same summation order: ZeRO-1 vs
           ZeRO-0, same-mesh resume).
--fp64-sums (with --bit): the params bit-identical, the series within 4 fp64
           ulps (1e-15 relative): pp without dp/tp, where every fp32 value is
           the single rank's but the loss terms and the squared gradient norm
           are fp64 sums of per-stage partial sums (another association).
otherwise: the fp32 re-association bounds below (docs/testing.md derives them):
  losses, lm_losses           <= TOL relative (default 1e-6)
  aux_losses, z_losses        <= 10 * TOL relative (router-only terms)
  grad_norms                  <= 10 * TOL relative
  params (every element)      |a-b| <= 0.01 * lr * TOL / 1e-6 (1% of one
                              step's update at the default TOL)
A comparison of nothing (no steps, no tensors, a missing file) fails.
Prints one line per quantity with the worst difference and where it is.
"""
import json
import os
import re
import sys

from array import array

SERIES = ("losses", "lm_losses", "aux_losses", "z_losses", "grad_norms")
# bounds relative to TOL, derived in docs/testing.md ("Tolerances")
FACTOR = {"losses": 1.0, "lm_losses": 1.0, "aux_losses": 10.0, "z_losses": 10.0, "grad_norms": 10.0}
PARAM_STEP_FRAC = 0.01   # of the smaller learning rate: |d| per element, at TOL 1e-6
FP64_SUMS = 1e-15        # 4 ulps of fp64 (2^-53 = 1.1e-16)


def last_ckpt(run):
    d = os.path.join(run, "ckpt")
    steps = sorted(s for s in os.listdir(d) if re.fullmatch(r"step_\d+", s))
    if not steps:
        raise SystemExit("no checkpoint under %s" % d)
    return os.path.join(d, steps[-1])


def tensors(ck):
    m = json.load(open(os.path.join(ck, "manifest.json")))
    raw = {}
    out = {}
    for t in m["tensors"]:
        if t["file"] != "params.bin":
            continue
        if t["file"] not in raw:
            raw[t["file"]] = open(os.path.join(ck, t["file"]), "rb").read()
        n = 1
        for s in t["shape"]:
            n *= s
        v = array("f")
        v.frombytes(raw[t["file"]][t["offset"]:t["offset"] + 4 * n])
        if len(v) != n:
            raise SystemExit("%s: %s runs past the end of params.bin" % (ck, t["name"]))
        if sys.byteorder != "little":
            v.byteswap()
        out[t["name"]] = (tuple(t["shape"]), v)
    return m["meta"]["step"], out


def rel(a, b):
    """|a-b| / |a| per step; 0 where both are equal (a dense model's aux loss is 0)."""
    return [0.0 if x == y else abs(x - y) / max(abs(x), 1e-300) for x, y in zip(a, b)]


def main(argv):
    args = list(argv)
    skip, bit, fp64, tol, params = 0, False, False, 1e-6, True
    pos = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--skip":
            skip = int(args[i + 1]); i += 2; continue
        if a == "--tol":
            tol = float(args[i + 1]); i += 2; continue
        if a == "--bit":
            bit = True; i += 1; continue
        if a == "--fp64-sums":
            fp64 = True; i += 1; continue
        if a == "--no-params":
            params = False; i += 1; continue
        pos.append(a); i += 1
    if len(pos) != 2:
        raise SystemExit(__doc__)
    ref, run = pos
    ra = json.load(open(os.path.join(ref, "receipt.json")))
    rb = json.load(open(os.path.join(run, "receipt.json")))
    ok = True
    for k in SERIES:
        a = ra[k][skip:]
        b = rb[k]
        if len(a) != len(b) or len(a) == 0:
            print("   %-10s length %d vs %d: FAIL" % (k, len(a), len(b)))
            ok = False
            continue
        if bit and fp64:
            r = rel(a, b)
            j = max(range(len(r)), key=r.__getitem__)
            good = r[j] <= FP64_SUMS
            if not good:
                print("   %-10s differs by %.3g relative at step %d (fp64 sums: bound %.3g): FAIL" % (k, r[j], skip + j, FP64_SUMS))
            ok &= good
            continue
        if bit:
            same = a == b
            if not same:
                first = next(j for j in range(len(a)) if a[j] != b[j])
                print("   %-10s NOT bit-identical (first at step %d: %r vs %r)" % (k, skip + first, a[first], b[first]))
            ok &= same
            continue
        r = rel(a, b)
        j = max(range(len(r)), key=r.__getitem__)
        lim = tol * FACTOR[k]
        good = bool(r[j] <= lim)
        print("   %-10s max rel %.3g at step %d (bound %.3g)%s" % (k, r[j], skip + j, lim, "" if good else ": FAIL"))
        ok &= good
    if bit:
        print("   series     %s over %d steps" % (("within 4 fp64 ulps" if fp64 else "bit-identical") if ok else "DIFFER",
                                                len(rb["losses"])))
    if params:
        sa, ta = tensors(last_ckpt(ref))
        sb, tb = tensors(last_ckpt(run))
        if sa != sb or set(ta) != set(tb) or not ta:
            print("   params     checkpoint step %s vs %s, %d vs %d tensors: FAIL" % (sa, sb, len(ta), len(tb)))
            return 1
        worst, wname, wabs, nbad = 0.0, "", 0.0, 0
        for name, (shx, x) in ta.items():
            shy, y = tb[name]
            if shx != shy:
                print("   params     %s shape %s vs %s: FAIL" % (name, shx, shy))
                return 1
            if bit:
                if x.tobytes() != y.tobytes():
                    nbad += 1
                    if not wname:
                        wname = name
                continue
            d = max(abs(u - v) for u, v in zip(x, y))
            s = max(abs(u) for u in x)
            r = d / s if s > 0 else (0.0 if d == 0 else float("inf"))
            if d > wabs or not wname:
                worst, wname, wabs = r, name, d
        if bit:
            print("   params     %d tensors at step %d: %s" % (len(ta), sa, "bit-identical" if nbad == 0 else
                                                                "%d differ (first %s): FAIL" % (nbad, wname)))
            ok &= nbad == 0
        else:
            cfg = ra["config"]
            lim = PARAM_STEP_FRAC * min(cfg["lr"], cfg.get("muon_lr", cfg["lr"])) * tol / 1e-6
            good = wabs <= lim
            print("   params     %d tensors at step %d: max |d| %.3g in %s (%.3g of its max |value|; bound %.3g)%s"
                  % (len(ta), sa, wabs, wname, worst, lim, "" if good else ": FAIL"))
            ok &= good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
