#!/usr/bin/env python3
"""banks_check.py [--allow FILE] COUNTS... -- the emulator's shared-memory
bank-conflict counts (MT_EMU_BANKS=FILE, tests/cuda/emu/emu.cc: one line a
kind and kernel instantiation, KIND NAME PHASES WAVEFRONTS WORST; KIND
ldmatrix, ld, st or cp.async) against the ideal of one wavefront a phase;
and the same for its global-memory sector counts (MT_EMU_COALESCE=FILE: KIND
gld, gst or gcp.async, PHASES the sectors a request needs, WAVEFRONTS those it
touches), against the ideal of one sector a needed one.

A phase is 128 bytes of a warp's request (an ldmatrix.x4 has 4, a plain
access of up to 4 bytes a lane 1, of 16 bytes 4); conflict-free it is 1
wavefront. A kernel whose phases of one kind average more than LIMIT
wavefronts (a padding or swizzle that leaves rows on the same banks: 8
ldmatrix rows 128 bytes apart cost 8; 16 lanes storing 2-byte elements 1024
bytes apart cost 16) fails, named. Rare 2-way phases (a partial tile's edge
rows) stay under the limit.

The allow-list (tests/cuda/banks_allow.txt for the banks,
tests/cuda/coalesce_allow.txt for the sectors: KIND NAME CEILING REASON, NAME
as counted without its spaces) names the kernels known to exceed it, each
with its own ceiling: a kernel over its ceiling still fails (a regression),
one under LIMIT is reported (NOTE: the entry can go if no other counted run
needs it). Exit 0 when every kernel is under its limit, 1 otherwise, 2 when
no file had a line.
"""
import sys

LIMIT = 1.05
KINDS = ("ldmatrix", "ld", "st", "cp.async", "gld", "gst", "gcp.async")


def unit(kind):
    """what a kind's ratio counts"""
    return "sectors a needed sector" if kind.startswith("g") else "wavefronts a phase"


def read_allow(path):
    allow = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            kind, name, ceiling = line.split(None, 3)[:3]
            allow[(kind, name)] = float(ceiling)   # a name as counted, without its spaces
    return allow


def read_counts(paths):
    rows = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    kind, _, rest = line.partition(" ")
                    parts = rest.rsplit(None, 3)
                    if len(parts) == 4:
                        rows.append((kind, parts[0].replace(" ", ""), int(parts[1]), int(parts[2]), int(parts[3])))
        except OSError:
            pass
    return rows


def main(argv):
    allow, allow_path = {}, "tests/cuda/banks_allow.txt"
    if len(argv) >= 2 and argv[0] == "--allow":
        allow, allow_path = read_allow(argv[1]), argv[1]
        argv = argv[2:]
    rows = read_counts(argv)
    if not rows:
        print("FAIL: bank-conflict / sector counts: no counts in %s" % " ".join(argv))
        return 2
    bad, allowed, seen = [], [], set()
    for kind, name, ph, w, worst in rows:
        mean = w / max(ph, 1)
        limit = allow.get((kind, name), LIMIT)
        seen.add((kind, name))
        if mean > limit:
            bad.append((kind, name, mean, worst, limit))
        elif mean > LIMIT:
            allowed.append((kind, name, mean))
    for kind, name, mean, worst, limit in bad:
        print("FAIL: %s %s: %.2f %s (worst %d; ideal 1, limit %.2f%s)"
              % (kind, name, mean, unit(kind), worst, limit, " from " + allow_path if limit != LIMIT else ""))
    for key, ceiling in sorted(allow.items()):
        means = [w / max(ph, 1) for k, n, ph, w, _ in rows if (k, n) == key]
        if key in seen and max(means) <= LIMIT:
            print("NOTE: %s %s is allowed %.2f but measured %.4f here (if so in every counted run, its "
                  "entry in %s can go)" % (key[0], key[1], ceiling, max(means), allow_path))
    for kind in KINDS:
        of_kind = [r for r in rows if r[0] == kind]
        if not of_kind:
            continue
        top = max(of_kind, key=lambda r: r[3] / max(r[2], 1))
        what = ("sectors, %s: %d kernel instantiations, %d needed; worst request %d times its need"
                if kind.startswith("g") else
                "bank conflicts, %s: %d kernel instantiations, %d phases; worst phase %d wavefronts")
        print(("%s " + what + ", highest mean %.4f (%s)")
              % ("FAIL" if any(b[0] == kind for b in bad) else "PASS", kind, len(of_kind), sum(r[2] for r in of_kind),
                 max(r[4] for r in of_kind), top[3] / max(top[2], 1), top[1]))
    if allowed:
        print("allowed (%s): %d instantiations over %.2f, each under its ceiling" % (allow_path, len(allowed), LIMIT))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
