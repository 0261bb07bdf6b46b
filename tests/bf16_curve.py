#!/usr/bin/env python3
"""bf16_curve.py FP32_RECEIPT BF16_RECEIPT [--other OTHER_BF16_RECEIPT] [--grad-reduce]

A precision=bf16 run follows the fp32 loss curve (docs/cuda.md, "bf16
training runs: the step tolerance"). For every step t, with L the fp32 run's
losses, n the tokens per step and u = 2^-8:

    |L16_t - L_t| <= c * u / sqrt(n) * (L_t + sum_{s<t} |L_s - L_{s+1}|),  c = 6 * 0.82

(the forward's rounding of step t plus the drift that the rounded gradients
of the earlier steps left in the weights, each at most c u / sqrt(n) of the
loss it acts on). Also: the bf16 run really rounded (some step differs by
more than 1e-6 relative), the receipts say runtime_mode fp32 / bf16, same
step count. With --other: another bf16 run of the same config (another
backend or mesh) starts equal to this one (first step's loss within
1e-5 + 8 K 2^-24 relative, K = d_model: the same weights rounded the same
way, only fp32 sums differ — and where a GEMM's output is stored in bf16
(the MLP's gate and up, gemm_bf16_out) a re-association difference of up
to K 2^-24 relative flips that output's rounding by one bf16 unit with a
probability of about 2 K 2^-24 / u per element, a relative error of the
order 2 K 2^-24 = 1.5e-5 at K 128 on average, where the emulated cuda run
of test_cuda_build's hd-64 config measured 3.4e-5: the bar is four times
the estimate, 6.1e-5 there) and stays within the same bound of it on every
step. Not closer: after the first
update the two runs' fp32 weights differ by re-association noise (~1e-7),
which flips the bf16 rounding of the weights it lands next to, a difference
of u in those elements — the same kind of error the bound is for.
With --grad-reduce: the two runs have the same precision and differ in
grad_reduce_dtype (fp32, bf16): the bf16 reduction's rounding of the
gradients is the same kind of error as the drift term, held to the same bound.
Prints the worst ratio to the bound; exit 1 on any failure.
"""
import json
import math
import sys

U = 2.0 ** -8
C = 6 * 0.82


def main(argv):
    reduce = "--grad-reduce" in argv
    if reduce:
        argv = [x for x in argv if x != "--grad-reduce"]
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--other"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    a, b = (json.load(open(p)) for p in argv[1:3])
    if reduce:   # the same precision, the gradients reduced in fp32 / bf16
        assert a["backend"]["runtime_mode"] == b["backend"]["runtime_mode"], (a["backend"], b["backend"])
        assert (a["config"]["grad_reduce_dtype"], b["config"]["grad_reduce_dtype"]) == ("fp32", "bf16")
    else:
        assert a["backend"]["runtime_mode"] == "fp32", a["backend"]
        assert b["backend"]["runtime_mode"] == "bf16", b["backend"]
    la, lb = a["losses"], b["losses"]
    assert len(la) == len(lb) >= 2, (len(la), len(lb))
    n = a["batch"]["tokens_per_step"]
    assert n == b["batch"]["tokens_per_step"], (n, b["batch"])
    worst, worst_t, drift, ran = 0.0, 0, 0.0, 0.0
    bounds = []
    for t, (x, y) in enumerate(zip(la, lb)):
        bound = C * U / math.sqrt(n) * (abs(x) + drift)
        bounds.append(bound)
        r = abs(y - x) / bound
        if r > worst:
            worst, worst_t = r, t
        ran = max(ran, abs(y - x) / abs(x))
        if t + 1 < len(la):
            drift += abs(la[t] - la[t + 1])
    print("bf16 vs fp32 over %d steps (n = %d tokens/step): worst |dL| / bound = %.3f at step %d; "
          "max rel diff %.2e" % (len(la), n, worst, worst_t, ran))
    ok = worst <= 1.0
    if ran <= 1e-6:
        print("FAIL: bf16 losses equal fp32's to 1e-6: bf16 did not run")
        ok = False
    if len(argv) == 5:
        c = json.load(open(argv[4]))
        assert c["backend"]["runtime_mode"] == "bf16", c["backend"]
        lc = c["losses"]
        assert len(lc) == len(lb), (len(lc), len(lb))
        d0 = abs(lc[0] - lb[0]) / abs(lb[0])
        r = max(abs(p - q) / bd for p, q, bd in zip(lb, lc, bounds))
        tol0 = 1e-5 + 8.0 * b["config"]["d_model"] * 2.0 ** -24   # the docstring: bf16-stored GEMM outputs
        print("bf16 %s vs bf16 %s (%s): first step rel diff %.2e (tol %.1e), worst |dL| / bound = %.3f"
              % (b["backend"]["actual"], c["backend"]["actual"], argv[4], d0, tol0, r))
        ok = ok and d0 <= tol0 and r <= 1.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
