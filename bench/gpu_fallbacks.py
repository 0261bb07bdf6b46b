#!/usr/bin/env python3
"""gpu_fallbacks.py LOGDIR — the speed stage's knobs from the ops stage's verdict.

bench/gpu.sh runs the op harnesses on the GPU (stage ops) before it times
anything (stage speed). Three kernel families are new since the last GPU run
and are the default in precision=bf16: attention v3, the Mamba-3 scan on tensor
cores, and the MoE experts' grouped GEMMs. If one of them fails its harness on
the device, a training that runs it can stop on a non-finite loss, and every
speed row that uses it gives no number. The device is lent rarely, for a few
minutes, so the speed stage then runs that family's predecessor instead, and
every line says so:

  test_attn_bf16 FAIL lines for cuda[v3] and none for cuda[v2] -> attn_kernel=v2
      (v2 failing too but not v1 -> attn_kernel=v1; the kernel sets run v1, v2, v3, v4,
      v5 in turn, so an error that poisons the context fails only the sets after its own;
      v4 and v5, the opt-in wgmma kernels, are not a default: their failures swap nothing);
      a log with no summary line crashed: its last "# attn_kernel vN" line (the test
      prints it, line-buffered, before each set) names the set that crashed (v2:
      v3 never ran, so v1);
  test_ssm -bf16 (the precision=bf16 scan's checks alone) failed -> scan_bf16=0
      (the fp32 scan kernels; the run's other kernels unchanged);
  cuda_ops_vs_cpu FAIL lines for gemm_grouped_rows / gemm_grouped_sum, or a log
      with no summary line whose last "# group" line (printed before each group of
      checks) is one of theirs (a crash or a hang there) -> moe_sizes=host (one
      cuBLASLt matmul per expert); not for the cases run on wgmma (knob
      grouped_gemm_kernel=wgmma, opt-in: their lines say " wgmma", and their groups,
      test_gemm_grouped_*_wgmma, run after the others);
  cuda_ops_vs_cpu FAIL lines for init_normal, or a crash inside test_init_normal
      -> param_init_device=0 (every parameter drawn on the host and copied: the
      device draw, init.cu, runs in every training's setup, so a fault there would
      cost every speed row).

Prints one line per fallback, "KNOB=VALUE<TAB>why". No line: nothing to change.
A log that is missing (that check did not run) changes nothing.
"""
import os
import re
import sys


def lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None


SETS = ("v1", "v2", "v3", "v4", "v5")   # test_attn_bf16's kernel sets, in the order they run


def attention_fails(logdir):
    """{set: failed checks} from the ops stage's test_attn_bf16 logs; a log with no summary line
    crashed inside its last "# attn_kernel vN" set, which counts as failed, and so does every set
    after it (they never ran). None: no log. (gpu_decide.py reads it too.)"""
    fails = {s: 0 for s in SETS}
    seen = False
    for name in ("test_attn_bf16.txt", "test_attn_bf16_ds0.txt"):
        ls = lines(os.path.join(logdir, name))
        if ls is None:
            continue
        seen = True
        current = None
        for ln in ls:
            m = re.match(r"FAIL\s+cuda\[(v[1-5])\]", ln)
            if m:
                fails[m.group(1)] += 1
            m = re.match(r"# attn_kernel (v[1-5])$", ln)
            if m:
                current = m.group(1)
        if current and not any(re.match(r"test_attn_bf16: \d+ passed", ln) for ln in ls):
            for s in SETS[SETS.index(current):]:
                fails[s] += 1   # crashed inside that set (no summary line); the later ones never ran
    return fails if seen else None


def attention(logdir):
    fails = attention_fails(logdir)   # v4, v5 (wgmma, opt-in) run last: they swap nothing
    if not fails or not fails["v3"]:
        return None
    if not fails["v2"]:
        return "attn_kernel=v2", "test_attn_bf16: %d v3 checks failed, v2 none" % fails["v3"]
    if not fails["v1"]:
        return "attn_kernel=v1", "test_attn_bf16: v3 (%d) and v2 (%d) checks failed, v1 none" % (
            fails["v3"], fails["v2"])
    return None


def scan(logdir):
    ls = lines(os.path.join(logdir, "test_ssm_bf16.txt"))
    if ls is None or any(ln.startswith("test_ssm: all checks passed") for ln in ls):
        return None
    n = sum(1 for ln in ls if ln.startswith("FAIL"))
    return "scan_bf16=0", "test_ssm -bf16 (the tensor-core scan's checks) failed%s" % (
        " %d checks" % n if n else " (no summary line: crashed?)")


def grouped(logdir):
    ls = lines(os.path.join(logdir, "ops_harness.txt"))
    if ls is None:
        return None
    n = sum(1 for ln in ls if re.match(r"cuda\s+gemm_grouped_(rows|sum)\b", ln) and ln.rstrip().endswith("FAIL")
            and " wgmma" not in ln)
    if n:
        return "moe_sizes=host", "cuda_ops_vs_cpu: %d gemm_grouped_rows/_sum checks failed" % n
    # no summary line: the harness crashed or its box ended it inside the group of its
    # last "# group" line (printed, line-buffered, before each group)
    if not any(re.match(r"cuda_ops_vs_cpu: \d+ checks", ln) for ln in ls):
        last = [m.group(1) for m in (re.match(r"# group (\w+)", ln) for ln in ls) if m]
        if last and last[-1] in ("test_gemm_grouped_rows", "test_gemm_grouped_sum"):
            return "moe_sizes=host", "cuda_ops_vs_cpu stopped inside %s (no summary line)" % last[-1]
    return None


def init(logdir):
    ls = lines(os.path.join(logdir, "ops_harness.txt"))
    if ls is None:
        return None
    n = sum(1 for ln in ls if re.match(r"cuda\s+init_normal\b", ln) and ln.rstrip().endswith("FAIL"))
    if n:
        return "param_init_device=0", "cuda_ops_vs_cpu: %d init_normal checks failed" % n
    if not any(re.match(r"cuda_ops_vs_cpu: \d+ checks", ln) for ln in ls):
        last = [m.group(1) for m in (re.match(r"# group (\w+)", ln) for ln in ls) if m]
        if last and last[-1] == "test_init_normal":
            return "param_init_device=0", "cuda_ops_vs_cpu stopped inside test_init_normal (no summary line)"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_fallbacks.py LOGDIR")
    for f in (attention, scan, grouped, init):
        r = f(sys.argv[1])
        if r:
            print("%s\t%s" % r)


if __name__ == "__main__":
    main()
