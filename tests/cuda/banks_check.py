#!/usr/bin/env python3
"""banks_check.py FILE... -- the emulator's ldmatrix bank-conflict counts
(MT_EMU_BANKS=FILE, tests/cuda/emu/emu.cc: one line a kernel instantiation,
NAME PHASES WAVEFRONTS WORST) against the ideal of one wavefront a phase.

An ldmatrix phase (8 rows of 16 bytes) conflict-free is 1 wavefront; a kernel
whose phases average more than LIMIT wavefronts (a padding or swizzle that
leaves rows on the same banks: 8 rows 128 or 256 bytes apart cost 8) fails,
named. Rare 2-way phases (a partial tile's edge rows) stay under the limit.
Exit 0 when every kernel is under it, 1 otherwise, 2 when no file had a line.
"""
import sys

LIMIT = 1.05


def main(paths):
    rows = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    parts = line.rsplit(None, 3)
                    if len(parts) == 4:
                        rows.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3])))
        except OSError:
            pass
    if not rows:
        print("FAIL: ldmatrix bank conflicts: no counts in %s" % " ".join(paths))
        return 2
    bad = [(n, w / ph, worst) for n, ph, w, worst in rows if ph and w / ph > LIMIT]
    for n, mean, worst in bad:
        print("FAIL: %s: %.2f wavefronts an ldmatrix phase (worst %d; conflict-free 1, limit %.2f)"
              % (n, mean, worst, LIMIT))
    mean_max = max(rows, key=lambda r: r[2] / max(r[1], 1))
    print("%s ldmatrix bank conflicts: %d kernel instantiations, %d phases; worst phase %d wavefronts, "
          "highest mean %.4f (%s)" % ("FAIL" if bad else "PASS", len(rows), sum(r[1] for r in rows),
                                      max(r[3] for r in rows), mean_max[2] / max(mean_max[1], 1), mean_max[0]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
