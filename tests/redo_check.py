#!/usr/bin/env python3
"""redo_check.py — checks of ReDo runs (tests/test_redo.sh; SPEC 1e, docs/model.md "ReDo").

  redo_check.py event ON OFF STEP     ON (redo_every = STEP) and OFF (redo_every 0), same
        config, both saved at STEP (the event's step): every tensor of ON's params.bin and
        optim.bin equals OFF's bit for bit, except, for each unit j the receipt lists, row j of
        Wg and Wu = float(0.02 * normal(seed, xxh64("<name>@redo<STEP>"), j*cols + c)) (the init
        generator, re-implemented here), column j of Wd = 0, and the optimizer states of those
        tensors 0 on the same rows / column (exactly: no other element moved)
  redo_check.py units REF RUN...      every RUN's receipt redo.events equal REF's (steps, counts
        per layer, unit lists, hash), and REF recycled some units but not all of any set
  redo_check.py receipt RUN L         the receipt's redo object: every, tau, events with step,
        recycled == sum(per_layer), per_layer of length L, units_xxh64
"""
import json, math, struct, sys

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def xxh64(data, seed=0):
    n, i = len(data), 0
    def rnd(acc, lane):
        return (rotl((acc + lane * P2) & M64, 31) * P1) & M64
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = rnd(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for k in range(4):
            h = ((h ^ rnd(0, v[k])) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M64), 11) * P1) & M64
        i += 1
    h ^= h >> 33; h = (h * P2) & M64; h ^= h >> 29; h = (h * P3) & M64; h ^= h >> 32
    return h


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def uniform(seed, stream, c):
    bits = splitmix(seed ^ splitmix((stream + c) & M64))
    return ((bits >> 11) + 1.0) * (1.0 / 9007199254740992.0)


def normal(seed, stream, e):
    u1, u2 = uniform(seed, stream, 2 * e), uniform(seed, stream, 2 * e + 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def ckpt(run, step):
    d = "%s/ckpt/step_%06d" % (run, step)
    m = json.load(open(d + "/manifest.json"))
    raw = {f: open(d + "/" + f, "rb").read() for f in ("params.bin", "optim.bin")}
    out = {}
    for t in m["tensors"]:
        n = 1
        for s in t["shape"]:
            n *= s
        out[t["name"]] = (t["shape"], list(struct.unpack_from("<%df" % n, raw[t["file"]], t["offset"])))
    return m, out


def event(on, off, step):
    rc = json.load(open(on + "/receipt.json"))
    seed = int(rc["config"]["seed"])
    ev = [e for e in rc["redo"]["events"] if e["step"] == step]
    assert len(ev) == 1, "no event at step %d" % step
    units = ev[0]["units"]
    assert ev[0]["recycled"] > 0 and not ev[0]["units_truncated"]
    _, a = ckpt(on, step)
    _, b = ckpt(off, step)
    assert a.keys() == b.keys()
    expect = {}   # tensor name -> {flat index: value}
    for key, js in units.items():
        for w, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
            pname = "%s.%s.weight" % (key, proj)
            shape, _ = a[pname]
            rows, cols = shape
            stream = xxh64(("%s@redo%d" % (pname, step)).encode())
            names = [n for n in a if n == pname or n.startswith(pname + ".")]   # the tensor and its states
            for n in names:
                d = expect.setdefault(n, {})
                for j in js:
                    if w < 2:
                        for c in range(cols):
                            e = j * cols + c
                            d[e] = f32(0.02 * normal(seed, stream, e)) if n == pname else 0.0
                    else:
                        for r in range(rows):
                            d[r * cols + j] = 0.0
    moved = fresh = 0
    for n in a:
        x, y = a[n][1], b[n][1]
        ex = expect.get(n, {})
        for i in range(len(x)):
            if i in ex:
                assert x[i] == ex[i], "%s[%d] = %r, expected %r" % (n, i, x[i], ex[i])
                fresh += 1
            else:
                assert struct.pack("<f", x[i]) == struct.pack("<f", y[i]), "%s[%d] moved: %r vs %r" % (n, i, x[i], y[i])
        moved += n in expect
    print("   event at step %d: %d units, %d tensors rewritten (%d elements as expected), every other element "
          "bit-identical to the run without ReDo" % (step, ev[0]["recycled"], moved, fresh))


def units(ref, runs):
    a = json.load(open(ref + "/receipt.json"))["redo"]["events"]
    assert a and all(e["recycled"] > 0 for e in a), "the reference recycled nothing"
    for e in a:
        for key, js in e["units"].items():
            assert len(js) < (64 if key.endswith(".mlp") else 16 if key.endswith("shared_expert") else 32), \
                "a whole set recycled: tau too high"
    for r in runs:
        b = json.load(open(r + "/receipt.json"))["redo"]["events"]
        if a != b:
            for x, y in zip(a, b):
                if x != y:
                    print("   step %d: %s differs from %s:\n     %s\n     %s" % (x["step"], r, ref, x, y))
                    break
            sys.exit(1)
    print("   %d events, %s units recycled: equal on %d meshes" % (len(a), [e["recycled"] for e in a], len(runs)))


def receipt(run, L):
    r = json.load(open(run + "/receipt.json"))["redo"]
    assert r["every"] > 0 and r["tau"] >= 0 and r["events"]
    for e in r["events"]:
        assert e["step"] % r["every"] == 0 and len(e["per_layer"]) == L and sum(e["per_layer"]) == e["recycled"]
        assert len(e["units_xxh64"]) == 16
        assert sum(len(v) for v in e["units"].values()) == e["recycled"]
    print("   redo: every %d, tau %g, events at %s" % (r["every"], r["tau"], [e["step"] for e in r["events"]]))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "event":
        event(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "units":
        units(sys.argv[2], sys.argv[3:])
    elif cmd == "receipt":
        receipt(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: redo_check.py event|units|receipt ...")
