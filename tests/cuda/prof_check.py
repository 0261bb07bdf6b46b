#!/usr/bin/env python3
"""prof_check.py — checks of the cuda backend's per-step counters, per-op
profile and launch geometry, read from an emulated training run
(tests/test_cuda_build.sh stage f; docs/cuda.md "Per-op profile and
counters").

  prof_check.py counters RECEIPT LAUNCH_LOG [--moe-layers N] [--microbatches M] [--engines K]
      The receipt of a `meshtrain train --backend cuda` run under the CPU
      emulator (MT_CUDA_LAUNCH_LOG=LAUNCH_LOG). Fails on:
        - a device allocation or free in any step after the first, or in the
          first step one that is not a growth of the backend's grow-only
          workspace (its first users size it);
        - host waits, host-to-device or device-to-host copies other than the
          expected ones (issue 27 item 3, docs/cuda.md "Host waits in the
          step"), which are, per step:
            K  the gradient norm: one sumsq_multi per ZeRO engine (K = 1 on
               one rank), its partials and the non-finite marks of every
               unit's gradients (nonfinite_mark, no wait) summed on the
               device: 1 D2H + 1 wait each
            2M the micro-batches' token ids and targets: 1 H2D + 1 wait each
            1  the step's loss scalar: 1 D2H + 1 wait
            M(E+1)+1 the MoE layers' device routing (docs/cuda.md "MoE on the
               device"), per micro-batch forward: 1 D2H of the E+1 expert
               offsets per MoE layer (the grouped GEMM's host sizes) and 1
               D2H of all layers' aux/z sums, each waited for; nothing in
               the backward, no H2D; and per step 1 D2H of the load
               histogram (counted on the device, read by the trainer)
            1  the trainer's sync at the step's end
          K is counted from the launch log (sumsq_multi_pass2_k) and must
          equal --engines; a single-tensor sumsq with a host read (the
          per-tensor gradient norm, Muon's per-matrix norm before
          normalize_fro: sumsq_pass2_k launches not followed by
          normalize_fro's scale_rnorm_k) or an all_finite (nonfinite_k) in
          the step fails, as does a single-tensor AdamW launch (adamw_k: the
          update is adamw_multi_k, one launch per list of 32 tensors);
        - kernel launches in the receipt != the launch log's lines between
          the step marks (two counts of the same launches), or steps that
          differ from each other (every step of a static shape is the same);
        - a missing timing field: timing.op_profile_s_per_step with every
          kind (attention_bwd too) summing to the step and |other| <= 5% of
          it (under the emulator the kernels dwarf the host work between
          them: a larger remainder is an op outside the wrappers);
          timing_emulated true (emulated times mean nothing for a GPU);
          timing.op_profile_by_entry: the entries (largest first, no
          mt_cuda_ prefix, a gemm among them) summing to the kinds.

  prof_check.py kernels RECEIPT LAUNCH_LOG
      A run with MT_CUDA_KERNEL_PROFILE=1 (every launch timed too): the
      receipt says gpu.kernel_profile; timing.op_profile_by_entry has
      "kernel:NAME" entries beside the table entries; the table entries
      alone still sum to the kinds (the kernel pairs are not counted
      twice); the kernel entries' calls per step equal the launches of a
      step in the log (every launch of the step timed), and each kernel's
      calls per step its launches; the kernel times sum to at most the
      table entries' (a kernel runs inside an entry).

  prof_check.py floor LAUNCH_LOG --floor N --allow FILE
      Every kernel launched inside a step (between the "step K begin/end"
      marks) with its thread count (grid x block). Fails on a launch below N
      threads whose kernel is not in the allow-list FILE ("name  reason" per
      line, # comments), listing allowed ones as ALLOWED with the reason and
      allow-list entries no longer needed as a NOTE.
"""
import collections
import json
import sys

COUNTERS = ["kernel_launches", "blas_calls", "memsets", "h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes",
            "d2d_copies", "d2d_bytes", "host_syncs", "device_allocs", "device_frees", "workspace_grows"]
KINDS = ["gemm", "attention", "xent", "norm", "elementwise", "optimizer", "communication", "scan", "attention_bwd"]


def read_log(path):
    """{step: [(name, threads, grid, block)]} for the launches inside step marks."""
    steps, cur = {}, None
    for line in open(path):
        w = line.split()
        if not w:
            continue
        if w[0] == "step" and w[2] == "begin":
            cur = int(w[1])
            steps[cur] = []
        elif w[0] == "step" and w[2] == "end":
            cur = None
        elif w[0] == "launch" and cur is not None:
            steps[cur].append((w[1], int(w[w.index("threads") + 1]), tuple(w[3:6]), tuple(w[7:10])))
    return steps


def counters(argv):
    rec, log = argv[0], argv[1]
    moe_layers = int(argv[argv.index("--moe-layers") + 1]) if "--moe-layers" in argv else 0
    mb = int(argv[argv.index("--microbatches") + 1]) if "--microbatches" in argv else 1
    engines = int(argv[argv.index("--engines") + 1]) if "--engines" in argv else 1
    # device routing: per micro-batch, one offsets read per MoE layer + one aux/z read;
    # per step, one read of the load histogram
    routing = mb * (moe_layers + 1) + 1 if moe_layers > 0 else 0
    r = json.load(open(rec))
    err = []
    sc = r["gpu"]["step_counters"]
    n = sc["steps"]
    steps = read_log(log)
    if n < 2 or sc["steps_listed"] != n or sorted(steps) != list(range(n)):
        err.append("steps: receipt %d (listed %d), launch log %s" % (n, sc["steps_listed"], sorted(steps)))
    for k in range(min(n, len(steps))):
        c = {name: sc[name][k] for name in COUNTERS}
        names = collections.Counter(s[0] for s in steps[k])
        # K gradient-norm reads; S single-tensor sumsq reads (normalize_fro's
        # pass 2 has no read: it is followed by its scale_rnorm_k); F all_finite
        K = names["sumsq_multi_pass2_k"]
        S = names["sumsq_pass2_k"] - names["scale_rnorm_k"]
        F = names["nonfinite_k"]
        exp = {"host_syncs": K + S + F + 2 * mb + 1 + routing + 1,
               "d2h_copies": K + S + F + 1 + routing,
               "h2d_copies": 2 * mb,
               "kernel_launches": len(steps[k]),
               "device_allocs": c["workspace_grows"] if k == 0 else 0,
               "device_frees": c["device_frees"] if k == 0 and c["device_frees"] <= c["workspace_grows"] else 0}
        why = ("%d gradient-norm read(s) + %d sumsq + %d all_finite + %d input H2D + 1 loss D2H + "
               "%d MoE routing D2H (offsets, aux/z, load histogram) + 1 end-of-step sync" % (K, S, F, 2 * mb, routing))
        if K != engines:
            err.append("step %d: %d gradient-norm reads (sumsq_multi_pass2_k), expected %d (one per engine)"
                       % (k, K, engines))
        if S or F:
            err.append("step %d: %d single-tensor sumsq and %d all_finite host reads in the step, expected none "
                       "(the norm is one sumsq_multi, Muon's normalize_fro, the finiteness nonfinite_mark)" % (k, S, F))
        if names["adamw_k"] or names["adamw_multi_k"] == 0:
            err.append("step %d: %d single-tensor adamw_k and %d adamw_multi_k launches (AdamW must be multi-tensor)"
                       % (k, names["adamw_k"], names["adamw_multi_k"]))
        print("   step %d: %s" % (k, ", ".join("%s %d" % (name, c[name]) for name in COUNTERS)))
        print("   step %d: expected host_syncs %d = %s" % (k, exp["host_syncs"], why))
        for name, want in exp.items():
            if c[name] != want:
                err.append("step %d: %s = %d, expected %d%s" % (k, name, c[name], want,
                                                               " (" + why + ")" if name == "host_syncs" else ""))
    if n >= 2:
        for name in COUNTERS:
            if name in ("device_allocs", "device_frees", "workspace_grows"):
                continue
            if len(set(sc[name][1:])) > 1 or (name != "host_syncs" and sc[name][0] != sc[name][1]):
                err.append("%s differs between steps: %s" % (name, sc[name]))
    t = r["timing"]
    if t.get("timing_emulated") is not True:
        err.append("timing.timing_emulated is not true under the emulator")
    p = t.get("op_profile_s_per_step")
    if not p or list(p) != KINDS + ["other", "step"]:
        err.append("op_profile_s_per_step kinds: %s" % (list(p) if p else None))
    else:
        s = sum(p[k] for k in KINDS + ["other"])
        if abs(s - p["step"]) > 1e-9 * max(1.0, p["step"]) or abs(p["other"]) > 0.05 * p["step"]:
            # under the emulator the kernels dwarf the host work between them, so
            # |other| > 5% means an op ran outside the wrappers (or a wrapper double counts)
            err.append("profile: kinds + other = %g vs step %g, other %g (|other| must be <= 5%% of the step)"
                       % (s, p["step"], p["other"]))
        if not (p["gemm"] > 0 and p["attention"] > 0 and p["attention_bwd"] > 0 and p["optimizer"] > 0):
            err.append("profile: a kind that ran has no time: %s" % p)
        print("   op profile (emulated, s/step): %s" % ", ".join("%s %.3g" % (k, p[k]) for k in KINDS + ["other", "step"]))
        # the same time by table entry: names without the backend prefix, the
        # entries summing to the kinds (communication is the trainer's, no entry)
        ent = t.get("op_profile_by_entry") or []
        es = sum(e["s_per_step"] for e in ent)
        ks = sum(p[k] for k in KINDS if k != "communication")
        names = [e["name"] for e in ent]
        if not ent or abs(es - ks) > 1e-6 * max(1.0, ks) or any(n.startswith("mt_cuda_") for n in names) or \
                "gemm_bf16" not in names and "gemm" not in names or \
                any(ent[i]["s_per_step"] < ent[i + 1]["s_per_step"] for i in range(len(ent) - 1)):
            err.append("op_profile_by_entry: %d entries summing to %g vs the kinds' %g (names %s)" % (len(ent), es, ks, names))
        else:
            print("   by entry (largest 5): %s" % ", ".join("%s %.3g" % (e["name"], e["s_per_step"]) for e in ent[:5]))
    for e in err:
        print("FAIL:", e)
    return 1 if err else 0


def kernels(argv):
    r = json.load(open(argv[0]))
    steps = read_log(argv[1])
    err = []
    t = r.get("timing") or {}
    if (r.get("gpu") or {}).get("kernel_profile") is not True:
        err.append("gpu.kernel_profile is not true")
    ent = t.get("op_profile_by_entry") or []
    p = t.get("op_profile_s_per_step") or {}
    kern = [e for e in ent if e["name"].startswith("kernel:")]
    table = [e for e in ent if not e["name"].startswith("kernel:")]
    es = sum(e["s_per_step"] for e in table)
    ks = sum(p.get(k, 0) for k in KINDS if k != "communication")
    if abs(es - ks) > 1e-6 * max(1.0, ks):
        err.append("the table entries sum to %g, the kinds to %g (kernel pairs counted in a kind?)" % (es, ks))
    kt = sum(e["s_per_step"] for e in kern)
    if not kern or kt > es * (1 + 1e-6):
        err.append("%d kernel entries, %g s/step vs the entries' %g" % (len(kern), kt, es))
    if "kernel:(more)" in [e["name"] for e in kern]:
        err.append("more kernels than the profile labels")
    if steps:
        last = steps[max(steps)]
        per = collections.Counter(x[0] for x in last)
        calls = {e["name"][7:]: e["calls_per_step"] for e in kern}
        if abs(sum(calls.values()) - len(last)) > 1e-9:
            err.append("kernel calls per step %g != %d launches of step %d" % (sum(calls.values()), len(last), max(steps)))
        for name, c in per.items():
            if abs(calls.get(name, 0) - c) > 1e-9:
                err.append("%s: %g calls per step in the profile, %d launches in the log" % (name, calls.get(name, 0), c))
    else:
        err.append("no step marks in the launch log")
    for e in err:
        print("FAIL:", e)
    if not err:
        print("%d kernels timed (%d launches a step) beside %d table entries; largest: %s" % (
            len(kern), len(steps[max(steps)]), len(table),
            ", ".join("%s %.3g" % (e["name"], e["s_per_step"]) for e in kern[:4])))
    return 1 if err else 0


def floor(argv):
    log = argv[0]
    fl = int(argv[argv.index("--floor") + 1])
    allow = {}
    for line in open(argv[argv.index("--allow") + 1]):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, why = line.partition(" ")
            allow[name] = why.strip()
    steps = read_log(log)
    if not steps:
        print("FAIL: no step marks / launches in %s" % log)
        return 1
    low = {}      # kernel -> min threads, grid, block
    seen = {}
    for k, launches in steps.items():
        for name, th, grid, block in launches:
            if name not in seen or th < seen[name][0]:
                seen[name] = (th, grid, block)
    print("   %d kernels launched in %d steps (floor %d threads = grid x block):" % (len(seen), len(steps), fl))
    for name in sorted(seen, key=lambda x: seen[x][0]):
        th, grid, block = seen[name]
        tag = "ok     " if th >= fl else ("ALLOWED" if name in allow else "LOW    ")
        print("   %s %-26s min threads %8d  grid %s block %s%s" % (tag, name, th, "x".join(grid), "x".join(block),
              "  -- " + allow[name] if th < fl and name in allow else ""))
        if th < fl:
            low[name] = th
    bad = [x for x in low if x not in allow]
    for x in sorted(allow):
        if x not in low:
            print("   NOTE: allow-list entry %s is not below the floor in this run (remove it when it is replaced)" % x)
    for x in bad:
        print("FAIL: %s launched with %d threads < floor %d and not in the allow-list" % (x, low[x], fl))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("counters", "floor", "kernels"):
        sys.exit(__doc__)
    sys.exit({"counters": counters, "floor": floor, "kernels": kernels}[sys.argv[1]](sys.argv[2:]))
