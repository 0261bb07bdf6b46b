#!/usr/bin/env python3
"""gpu_decide.py QUICK_DIR REST_DIR — what one GPU call pair says about the issues'
targets and the cuda backend's defaults.

bench/gpu.sh runs on a lent GPU in two calls, `quick` then `rest`, each
bringing back its own archive (unpacked under bench/results/<date>-<card>/).
Neither call sees the other's results on the device, and the choices they
feed (which opt-in kernel becomes a default) were written down across many
sessions. This script reads both unpacked result folders and prints, as
markdown:

  - the targets of issues 27 and 28, each met or not with its number:
      GPT-2 124M (c_gpt2_124m) >= 1.0x llm.c's tokens/s; d2048 dense MFU >=
      0.45 (stretch: >= 1.0x torch compiled); moe8 >= 1.0x torch eager
      (stretch: compiled); the hybrid (hyb2048) >= 0.8x the dense d2048
      tokens/s; an M layer's core (calib layer_core, the scan on tensor
      cores) no slower than an A layer's (the bf16 attention, hd 128 row);
    each with the opt-in kernel's row too where rest ran one;
  - the defaults, each "switch" or "keep" with the numbers behind it:
      attn_kernel v4 / v5 (opt-in wgmma attention): the ops stage's
        test_attn_bf16 has no FAIL line for the set, calib's rows are right
        (forward and backward) at hd 64 and 128, and its end-to-end rows are
        faster than the default's: d2048_dense_attnvN vs d2048_dense and not
        slower on c_gpt2_124m_attnvN vs c_gpt2_124m;
      grouped_gemm_kernel=wgmma: no " wgmma" FAIL line in the ops stage's
        harness, calib's three grouped_wgmma rows right, moe8_ggwgmma faster
        than moe8;
      moe_sizes (moe8_hostsizes vs moe8), cuda_graphs (c_gpt2_nographs vs
        c_gpt2), mamba_chunk (hyb2048_chunk32 / _chunk128 vs hyb2048) and
        scan_bf16 (hyb2048_scanfp32 vs hyb2048): the other value if its row
        is faster;
      the quick call's fallbacks (a default kernel family failed its
        harness on the device): each is a default to mend, not to keep.

"Faster" means by more than MARGIN (2%) in seconds per step: the rows come
from separate runs of a few steps on a shared host, so a smaller difference
keeps the default. quick and rest are separate calls: the same card only if
both summaries name the same device (checked, said).

Exit 0 with the report; 2 with one line on stderr when a folder has no
summary.json.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_fallbacks  # noqa: E402  (the ops stage's log readers: one parser of the harness formats)

MARGIN = 0.02


def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


class Runs:
    """The speed rows of both calls by name (rest's row wins a name both have)."""

    def __init__(self, quick, rest):
        self.rows = dict(quick.get("speed") or {})
        self.rows.update(rest.get("speed") or {})
        self.llmc = quick.get("llmc_tokens_per_s") or rest.get("llmc_tokens_per_s")

    def get(self, name, key):
        return (self.rows.get(name) or {}).get(key)

    def faster(self, new, base):
        """(True/False/None, why): new's s/step under base's by more than MARGIN"""
        a, b = self.get(new, "s_per_step"), self.get(base, "s_per_step")
        if not a or not b:
            return None, "%s or %s has no s/step" % (new, base)
        return a < b * (1.0 - MARGIN), "%s %.4f s vs %s %.4f s (%.3fx)" % (new, a, base, b, a / b)


def met(value, bar):
    return "-" if value is None else ("met" if value >= bar else "not met")


def targets(runs, calib, out):
    out.append("## Targets (issues 27, 28)\n")
    out.append("| target | bar | row | value | |\n|---|---|---|---|---|")

    def row(target, bar, name, value):
        out.append("| %s | >= %g | %s | %s | %s |" % (target, bar, name, "-" if value is None else "%.3f" % value,
                                                      met(value, bar)))

    def ratio(a, b):
        return a / b if a and b else None

    for n in ("c_gpt2_124m", "c_gpt2_124m_attnv4", "c_gpt2_124m_attnv5"):
        if n == "c_gpt2_124m" or runs.get(n, "tokens_per_s"):
            row("GPT-2 124M vs llm.c (tokens/s)", 1.0, n, ratio(runs.get(n, "tokens_per_s"), runs.llmc))
    row("(GPT-2 shape, SwiGLU 3072: 1.26x llm.c's FLOPs a token) vs llm.c", 1.0, "c_gpt2",
        ratio(runs.get("c_gpt2", "tokens_per_s"), runs.llmc))
    for n in ("d2048_dense", "d2048_dense_attnv4", "d2048_dense_attnv5"):
        if n == "d2048_dense" or runs.get(n, "mfu"):
            row("d2048 dense MFU", 0.45, n, runs.get(n, "mfu"))
    row("d2048 dense vs torch compiled (stretch)", 1.0, "d2048_dense",
        runs.get("d2048_dense", "ratio_vs_torch_compiled"))
    for n in ("moe8", "moe8_ggwgmma"):
        if n == "moe8" or runs.get(n, "tokens_per_s"):
            row("moe8 vs torch eager", 1.0, n,
                ratio(runs.get(n, "tokens_per_s"), runs.get("moe8", "torch_eager_tokens_per_s")))
    row("moe8 vs torch compiled (stretch)", 1.0, "moe8", runs.get("moe8", "ratio_vs_torch_compiled"))
    row("hybrid vs dense d2048 (tokens/s)", 0.8, "hyb2048",
        ratio(runs.get("hyb2048", "tokens_per_s"), runs.get("d2048_dense", "tokens_per_s")))
    core = [x for x in (calib or {}).get("layer_core") or [] if "x128" in x.get("attention", "")]
    if core:
        x = core[0]
        s = x.get("scan_bf16_fwd_bwd_s", x.get("scan_fwd_bwd_s"))
        a = x.get("attention_bf16_fwd_bwd_s")
        # the bar is "no slower": attention / scan >= 1.0
        row("A layer core / M layer core (calib layer_core, hd 128)", 1.0, x.get("scan", "?"), ratio(a, s))
    else:
        row("A layer core / M layer core (calib layer_core, hd 128)", 1.0, "no calib row", None)
    out.append("")


def decide_attention(runs, calib, quick_dir, out):
    fails = gpu_fallbacks.attention_fails(os.path.join(quick_dir, "logs"))   # FAIL lines and crashes
    best = None
    for kv in ("v4", "v5"):
        why = []
        if fails is None:
            why.append("no test_attn_bf16 log from the ops stage")
        elif fails[kv]:
            why.append("test_attn_bf16 FAIL lines for cuda[%s], or it never finished" % kv)
        rows = (calib or {}).get("attention_" + kv) or []
        for hd in (64, 128):
            r = [x for x in rows if x.get("hd") == hd]
            if not r:
                why.append("no calib attention_%s row at hd %d" % (kv, hd))
            elif not all(x.get("ok") and x.get("bwd_ok") for x in r):
                why.append("calib: %s not right at hd %d" % (kv, hd))
        f128, w128 = runs.faster("d2048_dense_attn" + kv, "d2048_dense")
        a, b = runs.get("c_gpt2_124m_attn" + kv, "s_per_step"), runs.get("c_gpt2_124m", "s_per_step")
        if f128 is not True:
            why.append("d2048: " + w128 + ("" if f128 is None else ": not faster by %d%%" % (100 * MARGIN)))
        if a and b and a > b * (1.0 + MARGIN):
            why.append("GPT-2 124M: slower (%.4f vs %.4f s)" % (a, b))
        elif not (a and b):
            why.append("no c_gpt2_124m_attn%s row (hd 64 unmeasured end to end)" % kv)
        if why:
            out.append("- attn_kernel=%s: keep v3 — %s" % (kv, "; ".join(why)))
        else:
            s = runs.get("d2048_dense_attn" + kv, "s_per_step")
            out.append("- attn_kernel=%s: **switch** (right on the device; %s)" % (kv, w128))
            if best is None or s < best[1]:
                best = (kv, s)
    if best:
        out.append("  - attention default: **%s**" % best[0])


def decide_grouped(runs, calib, quick_dir, out):
    why = []
    harness = text(os.path.join(quick_dir, "logs", "ops_harness.txt"))
    if harness is None:
        why.append("no ops harness log")
    elif re.search(r"^FAIL.* wgmma", harness, re.M):
        why.append("the ops harness has wgmma FAIL lines")
    w = (calib or {}).get("grouped_wgmma") or []
    if not (len(w) == 3 and all(r.get("ok") is True for r in w)):
        why.append("calib: not three right grouped_wgmma rows")
    f, wf = runs.faster("moe8_ggwgmma", "moe8")
    if f is not True:
        why.append(wf + ("" if f is None else ": not faster by %d%%" % (100 * MARGIN)))
    out.append("- grouped_gemm_kernel=wgmma: %s" % ("keep mma — " + "; ".join(why) if why else "**switch** (" + wf + ")"))


def decide_pairs(runs, out):
    pairs = [("moe_sizes=host", "moe8_hostsizes", "moe8"), ("cuda_graphs=0", "c_gpt2_nographs", "c_gpt2"),
             ("mamba_chunk=32", "hyb2048_chunk32", "hyb2048"), ("mamba_chunk=128", "hyb2048_chunk128", "hyb2048"),
             ("scan_bf16=0", "hyb2048_scanfp32", "hyb2048")]
    for knob, new, base in pairs:
        f, why = runs.faster(new, base)
        verdict = "no row" if f is None else ("**switch**" if f else "keep the default")
        out.append("- %s: %s (%s)" % (knob, verdict, why))


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: gpu_decide.py QUICK_DIR REST_DIR\n")
        return 2
    quick_dir, rest_dir = argv[1], argv[2]
    quick, rest = load(os.path.join(quick_dir, "summary.json")), load(os.path.join(rest_dir, "summary.json"))
    for d, s in ((quick_dir, quick), (rest_dir, rest)):
        if s is None:
            sys.stderr.write("gpu_decide: %s has no readable summary.json\n" % d)
            return 2
    calib = load(os.path.join(rest_dir, "calib.json"))
    runs = Runs(quick, rest)
    out = ["# What this GPU call pair says (bench/gpu_decide.py)\n"]
    dq, dr = (quick.get("device") or {}).get("device"), (rest.get("device") or {}).get("device")
    out.append("Device: quick %s, rest %s%s\n" % (dq, dr, "" if dq == dr else " — **not the same card: compare "
                                                     "across the calls with care**"))
    targets(runs, calib, out)
    out.append("## Defaults (a row must be faster by more than %d%% per step to switch)\n" % (100 * MARGIN))
    fb = quick.get("speed_fallbacks") or []
    for k in fb:
        out.append("- fallback **%s** ran every speed row: a default kernel family failed on the device: mend it" % k)
    decide_attention(runs, calib, quick_dir, out)
    decide_grouped(runs, calib, quick_dir, out)
    decide_pairs(runs, out)
    if calib is None:
        out.append("- (rest has no calib.json: the calib-gated choices above keep their defaults)")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
