#!/usr/bin/env bash
# test_bf16_train.sh BUILD_DIR — precision=bf16 (issue 19 item 2, docs/cuda.md
# "bf16 mixed precision") on the cpu backend, whose gemm_bf16 rounds the
# operands exactly as the cuda one does (the cuda side: test_cuda_build.sh,
# stage c2, under the emulator):
#   1. a 12-step tiny dense run in bf16 follows the fp32 run's loss curve
#      within the step tolerance of docs/cuda.md (tests/bf16_curve.py) and
#      really differs from it; the receipt says runtime_mode bf16;
#   2. the bf16 shadows are device (backend) memory of the plan: the params
#      bucket of the plan grows by exactly 2 bytes per shadowed weight (the
#      attention/MLP matrices and the lm head: not the gains, not the
#      embedding), the acts bucket by the bf16 twins of the GEMM operands
#      (the final norm's output for the lm head; per layer the two input
#      norms' outputs and the attention output; the lm head's dlogits twin
#      written by xent_fused_bf16), the workspace bucket by the
#      SwiGLU output's twin and the dy scratch (struct mt_dyb: a projection's
#      output gradient rounded once for its two GEMMs), and the measured
#      peaks equal the plan;
#   3. the shadows are refreshed after every update and ZeRO-3 gather: dp=2
#      with --zero 3 (weights gathered per unit), pp=2 (units on two stages)
#      and tp=2 (sliced weights) in bf16 start equal to the one-rank bf16 run
#      (first loss to 1e-5) and stay within the step tolerance of it
#      (bf16_curve.py --other: fp32 re-association noise flips bf16
#      roundings, so not 1e-6 as in fp32); pp=2 is even bit-identical;
#   4. MoE (pattern=AEAE): the routed experts run on bf16 shadows too (the
#      plan's params bucket counts them), fallback_reason names nothing;
#      the run follows its fp32 curve;
#   4b. hybrid (pattern=MAMA, Mamba-3 M blocks): the mixer's in/out
#      projections run on bf16 shadows too (the plan's params bucket counts
#      the seven Win blocks and Wout per M layer; the acts bucket the twins
#      of their operands: the input norm's output and the gated norm's),
#      measured = plan,
#      fallback_reason names nothing; the run follows its fp32 curve;
#   4c. with --knob scan_bf16=0 (no chunk states kept) the plan still equals
#      the measured acts: the run's plan reads the run's knobs;
#   5. grad_reduce_dtype=bf16 (gradients reduced over the data group in
#      bf16, fp32 accumulation per pair) on dp=2, ZeRO-0 and ZeRO-2: follows
#      the fp32-reduction curve within the step tolerance and differs from it;
#      the receipt names the dtype, the bytes on the wire halve;
#   6. precision=fp16 is a config error (exit 2), writing nothing;
#   7. head_chunk_rows: bf16 with the lm head in row chunks = all rows (step
#      tolerance), the fp32 logits bounded in the plan; fp32 untouched (bits);
#   8. head_bf16_logits=0 within the step tolerance of the bf16 logits;
#   9. muon_ns_bf16=0 (Muon's Newton-Schulz in fp32) within the step tolerance
#      of the default bf16-operand iteration, and not the same run.
set -u
BUILD=${1:?usage: test_bf16_train.sh BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
source "$(dirname "$0")/dist_lib.sh"
t0=$(date +%s)
python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
DENSE="--set vocab_size=64 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=12 --set microbatches=2"
# The hybrid at the dense lr (0.01) trains at the edge of stability: near step 8 its
# loss drops steeply and any change of a rounding point moves that one step by about
# the whole first-order bound (bf16_curve.py: worst |dL| / bound 0.999 there with
# attention's D summed over fp32 operands, 1.056 over bf16 ones; 0.03-0.4 at every
# other step). At lr 0.005 (the curve still drops 4.17 -> 2.64 in 12 steps) the
# worst is 0.09, the margin the dense and MoE configs have: the regime the bound
# models. A perturbation of 1e-7 (fp32 at another mamba_chunk) stays at 0 either way.
HYB="$DENSE --set lr=0.005 --set pattern=MAMA --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8"
MOE="$DENSE --set pattern=AEAE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin --steps 12"

# 1. the curve
if run 1 "$W/fp32" $DENSE && run 1 "$W/bf16" $DENSE --set precision=bf16 &&
   python3 "$HERE/bf16_curve.py" "$W/fp32/receipt.json" "$W/bf16/receipt.json"; then
    ok "dense bf16 follows the fp32 loss curve within the step tolerance (12 steps)"
else bad "dense bf16 follows the fp32 loss curve"; tail -3 "$W/bf16.log"; fi

# 2. the shadows in the plan and in the measured peaks
if python3 - "$W/fp32/receipt.json" "$W/bf16/receipt.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
c = b["config"]
D, L, V, H, K = c["d_model"], c["n_layer"], c["vocab_size"], c["n_head"], c["n_kv_head"]
hd = D // H
F = -(-8 * D // 3); F = -(-F // 64) * 64
per_layer = [H * hd * D, K * hd * D, K * hd * D, D * H * hd, F * D, F * D, D * F]   # q k v o gate up down
shadows = [n for n in per_layer for _ in range(L)] + [V * D]                       # + lm_head
want = sum(-(-2 * n // 64) * 64 for n in shadows)                                   # 64-byte carves
pa, pb = a["memory"]["plan_bytes"]["params"], b["memory"]["plan_bytes"]["params"]
mb = b["memory"]["measured_peak_bytes"]["params"]
print("   plan params fp32 %d bf16 %d (+%d, shadows %d); measured bf16 %d" % (pa, pb, pb - pa, want, mb))
assert pb - pa == want, (pb - pa, want)
assert mb == pb, (mb, pb)
assert b["memory"]["plan_bytes"]["grads"] == a["memory"]["plan_bytes"]["grads"]
assert b["memory"]["plan_bytes"]["optim"] == a["memory"]["plan_bytes"]["optim"]   # fp32 master state unchanged
# the GEMMs' bf16 operands, each written by its producer (rows of a microbatch):
# the lm head's (final norm, h_final twin) and per layer the attention input
# norm's (q/k/v), the attention output's (Wo), the ffn input norm's (gate/up),
# all saved (ACTS), and the attention core's rounded q, k, v (qkv_b: its backward
# reads them again); the SwiGLU output's (down) is recomputed in backward: WORKSPACE;
# and the gate/up pre-activations stored bf16 (gemm_bf16_out: 2 bytes each, not 4)
rows = c["batch_size"] // c["microbatches"] * c["seq_len"]
carve = lambda n: -(-n // 64) * 64
twin = carve(2 * rows * D)
dlogits_twin = carve(2 * rows * V)   # xent_fused_bf16's bf16(dlogits), the lm head backward's dy
K = c["n_kv_head"]
gu_saved = 2 * (carve(2 * rows * F) - carve(4 * rows * F))   # mg, mu bf16 instead of fp32
per_layer_twins = (carve(2 * rows * D) + carve(2 * rows * H * hd) + carve(2 * rows * D) +
                   carve(2 * rows * (H + 2 * K) * hd) + gu_saved)
da = b["memory"]["plan_bytes"]["acts"] - a["memory"]["plan_bytes"]["acts"]
print("   plan acts +%d (h_final twin %d + dlogits twin %d + %d layers x %d); measured bf16 acts %d"
      % (da, twin, dlogits_twin, L, per_layer_twins, b["memory"]["measured_peak_bytes"]["acts"]))
assert da == twin + dlogits_twin + L * per_layer_twins, (da, twin, dlogits_twin, per_layer_twins)
assert b["memory"]["measured_peak_bytes"]["acts"] == b["memory"]["plan_bytes"]["acts"]
dw = b["memory"]["plan_bytes"]["workspace"] - a["memory"]["plan_bytes"]["workspace"]
# + the scratch of a projection's dy rounded once for its two backward GEMMs (struct mt_dyb):
# rows x the widest dense projection output
dyb = carve(2 * rows * max(D, H * hd, K * hd, F))
# + Muon's bf16 iteration (muon.c muon_ws_sizes): its batches' bf16 x, x', a, b (batch_cap:
# as many matrices as share a shape, at most 2^24 elements, each padded to 128 elements) in
# place of the fp32 iteration's x, y (the largest block matrix) and a, b (the largest s^2)
every = [(H * hd, D), (K * hd, D), (K * hd, D), (D, H * hd), (F, D), (F, D), (D, F)] * L
mats = sorted(set(every))
pad = lambda n: (n + 127) // 128 * 128
cap = lambda r, c: max(1, min(every.count((r, c)), (1 << 24) // (r * c)))
bn = max(cap(r, c) * pad(r * c) for r, c in mats)
bs = max(cap(r, c) * pad(min(r, c) ** 2) for r, c in mats)
ns = (2 * carve(4 * ((bn + 1) // 2)) + 2 * carve(4 * ((bs + 1) // 2)) - 2 * carve(4 * max(r * c for r, c in mats)) -
      2 * carve(4 * max(min(r, c) ** 2 for r, c in mats)))
print("   plan workspace +%d (SwiGLU output twin %d + dy scratch %d + Muon's bf16 batches %d); measured bf16 %d"
      % (dw, carve(2 * rows * F), dyb, ns, b["memory"]["measured_peak_bytes"]["workspace"]))
# (the measured workspace adds the backend's own scratch)
assert dw == carve(2 * rows * F) + dyb + ns, (dw, carve(2 * rows * F), dyb, ns)
PY
then ok "plan params bucket counts the bf16 shadows (2 bytes per shadowed weight); measured = plan"
else bad "plan params bucket counts the bf16 shadows"; fi

# 3. meshes in bf16 = one rank in bf16
for c in "dp2z3 2 --zero 3" "pp2 2 --mesh pp=2" "tp2 2 --mesh tp=2"; do
    set -- $c; name=$1; np=$2; shift 2
    if run "$np" "$W/bf16_$name" $DENSE --set precision=bf16 "$@" &&
       python3 "$HERE/bf16_curve.py" "$W/fp32/receipt.json" "$W/bf16/receipt.json" --other "$W/bf16_$name/receipt.json" &&
       { [ "$name" != pp2 ] || close "$W/bf16" "$W/bf16_$name" bit64; }; then
        ok "bf16 $name ($*) = bf16 one rank (first step 1e-5, then the step tolerance; pp2 bit-identical)"
    else bad "bf16 $name ($*) = bf16 one rank"; tail -3 "$W/bf16_$name.log"; fi
done

# 4. MoE: the routed experts in bf16 too (bf16 shadows: the params bucket
#    grows by 2 bytes per element of every expert matrix as well), nothing
#    named in fallback_reason; the run follows its fp32 curve
if run 1 "$W/moe32" $MOE && run 1 "$W/moe16" $MOE --set precision=bf16 &&
   python3 "$HERE/bf16_curve.py" "$W/moe32/receipt.json" "$W/moe16/receipt.json" &&
   python3 - "$W/moe32/receipt.json" "$W/moe16/receipt.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
f = b["backend"]["fallback_reason"] or ""
print("   fallback_reason:", repr(f))
assert "routed experts" not in f, f
c = b["config"]
D, L, V, H, K, E = c["d_model"], c["n_layer"], c["vocab_size"], c["n_head"], c["n_kv_head"], c["n_experts"]
Fe, Fs, hd = c["expert_hidden"], c["shared_expert_hidden"], D // c["n_head"]
F = -(-8 * D // 3); F = -(-F // 64) * 64
att = [H * hd * D, K * hd * D, K * hd * D, D * H * hd]
shadows = [V * D]
for l in c["pattern"]:
    shadows += att + ([F * D] * 3 if l == "A" else [Fe * D] * 3 * E + [Fs * D] * 3)
want = sum(-(-2 * n // 64) * 64 for n in shadows)
pa, pb = a["memory"]["plan_bytes"]["params"], b["memory"]["plan_bytes"]["params"]
print("   plan params fp32 %d bf16 %d (+%d, shadows incl. %d experts x %d layers: %d)"
      % (pa, pb, pb - pa, E, c["pattern"].count("E"), want))
assert pb - pa == want, (pb - pa, want)
assert b["memory"]["measured_peak_bytes"]["params"] == pb
# the routed experts' gate and up stored bf16 (moe.c moe_gu_bf16), and the shared expert's
# (moe_shared_gu): eg, eu, sgp, sup at 2 bytes an element; the plan carves what the run does
ga, gb = a["distributed"]["moe"]["expert_gate_up"], b["distributed"]["moe"]["expert_gate_up"]
print("   expert_gate_up fp32 run %s, bf16 run %s; acts plan %d measured %d"
      % (ga, gb, b["memory"]["plan_bytes"]["acts"], b["memory"]["measured_peak_bytes"]["acts"]))
assert ga == "fp32" and gb == "bf16", (ga, gb)
assert b["memory"]["measured_peak_bytes"]["acts"] == b["memory"]["plan_bytes"]["acts"]
PY
then
    ok "MoE bf16 (routed experts on bf16 shadows, gate/up stored bf16) follows its fp32 curve; no fallback_reason"
else bad "MoE bf16"; fi

# 4a. MoE with the expert sizes on the backend (knob moe_sizes=device: the
#     grouped GEMMs read the offsets there; cpu runs its reference entries,
#     the same products per group): the same bits as the host sizes, also
#     with recompute=block (the load histogram's undo on the backend); the
#     receipt says which ran, and auto stays on the host on cpu; dp=2 ZeRO-3
#     and pp=2 (the layer's offsets kept per microbatch slot) likewise
if run 1 "$W/moedev" $MOE --set precision=bf16 --knob moe_sizes=device &&
   close "$W/moe16" "$W/moedev" 0 >/dev/null &&
   run 1 "$W/moerc" $MOE --set precision=bf16 --set recompute=block &&
   run 1 "$W/moercdev" $MOE --set precision=bf16 --set recompute=block --knob moe_sizes=device &&
   close "$W/moerc" "$W/moercdev" 0 >/dev/null &&
   run 2 "$W/moez3" $MOE --set precision=bf16 --mesh dp=2 --zero 3 &&
   run 2 "$W/moez3dev" $MOE --set precision=bf16 --mesh dp=2 --zero 3 --knob moe_sizes=device &&
   close "$W/moez3" "$W/moez3dev" 0 >/dev/null &&
   run 2 "$W/moepp" $MOE --set precision=bf16 --mesh pp=2 &&
   run 2 "$W/moeppdev" $MOE --set precision=bf16 --mesh pp=2 --knob moe_sizes=device &&
   close "$W/moepp" "$W/moeppdev" 0 >/dev/null &&
   python3 - "$W/moe16/receipt.json" "$W/moedev/receipt.json" "$W/moercdev/receipt.json" <<'PY'
import json, sys
h, d, r = (json.load(open(p))["distributed"]["moe"] for p in sys.argv[1:])
assert h["expert_sizes"] == "host" and "auto on a host-memory backend" in h["expert_sizes_note"], h["expert_sizes_note"]
assert d["expert_sizes"] == "device" and r["expert_sizes"] == "device"
for x in (d, r):   # the histogram counted on the backend (recompute: its routing taken back out)
    assert x["tokens_per_expert_total"] == h["tokens_per_expert_total"], (x["tokens_per_expert_total"], h["tokens_per_expert_total"])
    assert x["expert_gate_up"] == h["expert_gate_up"] == "bf16", (x["expert_gate_up"], h["expert_gate_up"])
PY
then
    ok "MoE bf16 with moe_sizes=device: the host sizes' bits and load histogram (recompute=block, dp=2 ZeRO-3, pp=2 too)"
else bad "MoE bf16 with moe_sizes=device"; fi

# 4b. hybrid: the Mamba-3 projections on bf16 shadows, the input norm's twin
if run 1 "$W/hyb32" $HYB && run 1 "$W/hyb16" $HYB --set precision=bf16 &&
   python3 "$HERE/bf16_curve.py" "$W/hyb32/receipt.json" "$W/hyb16/receipt.json" &&
   python3 - "$W/hyb32/receipt.json" "$W/hyb16/receipt.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
f = b["backend"]["fallback_reason"] or ""
print("   fallback_reason:", repr(f))
assert "Mamba" not in f, f
c = b["config"]
D, V, H, K = c["d_model"], c["vocab_size"], c["n_head"], c["n_kv_head"]
hd = D // H
F = -(-8 * D // 3); F = -(-F // 64) * 64
E = c["mamba_expand"] * D
mH, G, N = E // c["mamba_headdim"], c["mamba_ngroups"], c["mamba_d_state"]
att = [H * hd * D, K * hd * D, K * hd * D, D * H * hd]
mix = [E * D, E * D, G * N * D, G * N * D, mH * D, mH * (N // 2) * D, mH * D, D * E]   # Win's seven blocks, Wout
mlp = [F * D] * 3
shadows = [V * D]
for l in c["pattern"]:
    shadows += (att if l == "A" else mix) + mlp
carve = lambda n: -(-n // 64) * 64
want = sum(carve(2 * n) for n in shadows)
pa, pb = a["memory"]["plan_bytes"]["params"], b["memory"]["plan_bytes"]["params"]
print("   plan params fp32 %d bf16 %d (+%d, shadows incl. %d M layers' Win/Wout: %d)"
      % (pa, pb, pb - pa, c["pattern"].count("M"), want))
assert pb - pa == want, (pb - pa, want)
assert b["memory"]["measured_peak_bytes"]["params"] == pb
# acts: per layer the input norm's twin (q/k/v or Win) and the ffn norm's
# twin; A layers also the attention output's (Wo) and the core's rounded q, k,
# v (qkv_b), M layers the gated norm output's (Wout, E wide); every layer's
# MLP its gate/up pre-activations in bf16 (2 bytes each, not 4); M layers also
# the bf16 scan's chunk states kept for its backward ((B, H, nc, P, N) bf16 in
# half as many floats, mt_ssm_states_floats: carved from the config, used on cuda); Bh and Ch's bf16
# twins (the scan's operands on cuda) live in the fp32 Ch's memory (mamba.c:
# no run uses both), so they add nothing;
# + the h_final twin and the lm head's dlogits twin
rows = c["batch_size"] // c["microbatches"] * c["seq_len"]
T, q = c["seq_len"], min(c["mamba_chunk"], c["seq_len"])
n_states = (rows // T) * mH * (-(-T // q)) * c["mamba_headdim"] * N
states = carve(4 * ((n_states + 1) // 2))
gu_saved = 2 * (carve(2 * rows * F) - carve(4 * rows * F))
want_a = carve(2 * rows * D) + carve(2 * rows * c["vocab_size"]) + sum(2 * carve(2 * rows * D) + gu_saved + (
    carve(2 * rows * H * hd) + carve(2 * rows * (H + 2 * K) * hd) if l == "A" else carve(2 * rows * E) + states)
                                   for l in c["pattern"])
da = b["memory"]["plan_bytes"]["acts"] - a["memory"]["plan_bytes"]["acts"]
print("   plan acts +%d (want %d); measured bf16 acts %d plan %d"
      % (da, want_a, b["memory"]["measured_peak_bytes"]["acts"], b["memory"]["plan_bytes"]["acts"]))
assert da == want_a, (da, want_a)
assert b["memory"]["measured_peak_bytes"]["acts"] == b["memory"]["plan_bytes"]["acts"]
PY
then
    ok "hybrid bf16 (Mamba-3 in/out projections on bf16 shadows, input norm twin) follows its fp32 curve; measured = plan"
else bad "hybrid bf16"; tail -3 "$W/hyb16.log"; fi

# 4c. a knob the pieces carve by (scan_bf16=0: the M layers keep no chunk
#     states): the run's plan sees the run's knobs, so plan = measured again
#     (the plan's model setup once read only the defaults: 16 KiB apart here)
if run 1 "$W/hyb16_nostates" $HYB --set precision=bf16 --knob scan_bf16=0 &&
   "$MT" plan $HYB --set precision=bf16 --knob scan_bf16=0 --profile none --json >"$W/hyb16_nostates_plan.json" &&
   python3 - "$W/hyb16/receipt.json" "$W/hyb16_nostates/receipt.json" "$W/hyb16_nostates_plan.json" <<'PY'
import json, sys
a, b, p = (json.load(open(f)) for f in sys.argv[1:])
pa, pb = a["memory"]["plan_bytes"]["acts"], b["memory"]["plan_bytes"]["acts"]
mb = b["memory"]["measured_peak_bytes"]["acts"]
pc = p["memory"]["per_rank"][0]["bytes"]["acts"]
print("   acts plan scan_bf16=1 %d, scan_bf16=0 %d (meshtrain plan --knob: %d), measured %d" % (pa, pb, pc, mb))
assert pb < pa, "the plan did not see --knob scan_bf16=0"
assert mb == pb == pc, (mb, pb, pc)
PY
then ok "hybrid bf16 with --knob scan_bf16=0: the plan carves by the run's knobs (measured = plan = meshtrain plan --knob)"
else bad "hybrid bf16 with --knob scan_bf16=0: plan vs measured"; fi

# 5. grad_reduce_dtype=bf16 over dp=2 (ZeRO-0 all-reduce and ZeRO-2
#    reduce-scatter): follows the fp32-reduction dp=2 run within the step
#    tolerance, differs from it (the bf16 reduction ran), the receipt says the
#    dtype and counts 2 bytes per reduced element, and the COMM plan holds the
#    bf16 staging (measured = plan, per rank)
for c in "z0 --zero 0" "z2 --zero 2"; do
    set -- $c; name=$1; shift
    if run 2 "$W/gr32_$name" $DENSE "$@" && run 2 "$W/gr16_$name" $DENSE --set grad_reduce_dtype=bf16 "$@" &&
       python3 "$HERE/bf16_curve.py" "$W/gr32_$name/receipt.json" "$W/gr16_$name/receipt.json" --grad-reduce &&
       python3 - "$W/gr32_$name/receipt.json" "$W/gr16_$name/receipt.json" "$name" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
la, lb = a["losses"], b["losses"]
assert la[0] == lb[0], ("step 1 is computed before any reduction", la[0], lb[0])
assert la != lb, "grad_reduce_dtype=bf16 changed nothing: the bf16 reduction did not run"
assert b["config"]["grad_reduce_dtype"] == "bf16", b["config"]["grad_reduce_dtype"]
cb = b["distributed"]["collective_bytes_per_step"]
ca = a["distributed"]["collective_bytes_per_step"]
assert cb["grad_reduce_dtype"] == "bf16" and ca["grad_reduce_dtype"] == "fp32", (cb["grad_reduce_dtype"], ca["grad_reduce_dtype"])
k = "allreduce" if sys.argv[3] == "z0" else "reduce_scatter"
assert cb[k]["measured"] * 2 == ca[k]["measured"] > 0, (k, cb[k], ca[k])
assert cb[k]["analytic"] * 2 == ca[k]["analytic"], (k, cb[k], ca[k])
pa, pb = a["memory"]["plan_bytes"], b["memory"]["plan_bytes"]
assert pb["comm"] > pa["comm"], (pa["comm"], pb["comm"])
ma, mb = a["memory"]["measured_peak_bytes"]["comm"], b["memory"]["measured_peak_bytes"]["comm"]
assert mb - ma == pb["comm"] - pa["comm"], (mb - ma, pb["comm"] - pa["comm"])   # the staging is planned
print("   %s: %s bytes/step fp32 %d bf16 %d; comm plan +%d, measured +%d" % (sys.argv[3], k, ca[k]["measured"], cb[k]["measured"], pb["comm"] - pa["comm"], mb - ma))
PY
    then ok "grad_reduce_dtype=bf16 dp=2 $name follows the fp32-reduction curve, differs from it, bf16 on the wire"
    else bad "grad_reduce_dtype=bf16 dp=2 $name"; tail -3 "$W/gr16_$name.log"; fi
done

# 6. refusals
"$MT" train $DENSE --set precision=fp16 $COMMON --out "$W/fp16" >"$W/fp16.log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q 'precision' "$W/fp16.log" && [ ! -e "$W/fp16" ]; then
    ok "precision=fp16 is a config error (exit 2, nothing written)"
else bad "precision=fp16 refused (exit $rc)"; tail -2 "$W/fp16.log"; fi
# 7. head_chunk_rows (docs/cuda.md "The bf16 twin of dlogits"): in bf16 the lm
#    head's logits GEMM and cross-entropy run in chunks of 24 of the 64 rows
#    (24, 24, 16): within the step tolerance of all rows at once (first loss
#    to 1e-5; not bits: OpenBLAS picks other kernels for the smaller logits
#    GEMM, fp32 re-association noise that the bf16 dlogits mostly round
#    away), the plan's acts bucket
#    smaller by the fp32 logits of the rows not kept (measured = plan); in
#    fp32 the key changes nothing (bits and plan); `meshtrain logits` (every
#    row's logits: 30 > 24) on the chunked run's checkpoint still works.
#    The chunks are the fp32-logits path (--knob head_bf16_logits=0): with the
#    default bf16 logits no fp32 logits exist to chunk.
if run 1 "$W/bf16_chunk" $DENSE --set precision=bf16 --set head_chunk_rows=24 --knob head_bf16_logits=0 &&
   run 1 "$W/fp32_chunk" $DENSE --set head_chunk_rows=24 &&
   python3 "$HERE/bf16_curve.py" "$W/fp32/receipt.json" "$W/bf16/receipt.json" --other "$W/bf16_chunk/receipt.json" &&
   close "$W/fp32" "$W/fp32_chunk" 0 &&
   "$MT" logits --ckpt "$W/bf16_chunk" --ids "$(seq -s, 1 30)" --out "$W/chunk_logits.safetensors" >"$W/chunk_logits.log" 2>&1 &&
   python3 - "$W/bf16/receipt.json" "$W/bf16_chunk/receipt.json" "$W/fp32/receipt.json" "$W/fp32_chunk/receipt.json" <<'PY'
import json, sys
b, bc, f, fc = (json.load(open(p)) for p in sys.argv[1:])
c = b["config"]
rows = c["batch_size"] // c["microbatches"] * c["seq_len"]
carve = lambda n: -(-n // 64) * 64
want = carve(4 * rows * c["vocab_size"]) - carve(4 * 24 * c["vocab_size"])
d = b["memory"]["plan_bytes"]["acts"] - bc["memory"]["plan_bytes"]["acts"]
print("   bf16 plan acts -%d with head_chunk_rows=24 (fp32 logits of %d rows -> 24: %d); measured %d"
      % (d, rows, want, bc["memory"]["measured_peak_bytes"]["acts"]))
assert d == want, (d, want)
assert bc["memory"]["measured_peak_bytes"]["acts"] == bc["memory"]["plan_bytes"]["acts"]
assert f["memory"]["plan_bytes"] == fc["memory"]["plan_bytes"], "fp32: head_chunk_rows changed the plan"
PY
then ok "head_chunk_rows=24: bf16 = all rows at once (step tolerance), logits bounded in the plan; fp32 bit-identical, plan unchanged"
else bad "head_chunk_rows"; tail -3 "$W/bf16_chunk.log"; fi

# 8. bf16 logits (knob head_bf16_logits, default 1; docs/cuda.md "bf16 logits"):
#    the lm head's GEMM output rounded once and the cross-entropy on it, against
#    the fp32 logits (=0): within the step tolerance (bf16_curve.py --other),
#    and not the same first loss (the bf16-logits path ran); plan unchanged
if run 1 "$W/bf16_f32logits" $DENSE --set precision=bf16 --knob head_bf16_logits=0 &&
   python3 "$HERE/bf16_curve.py" "$W/fp32/receipt.json" "$W/bf16/receipt.json" --other "$W/bf16_f32logits/receipt.json" &&
   python3 - "$W/bf16/receipt.json" "$W/bf16_f32logits/receipt.json" <<'PY'
import json, sys
b, f = (json.load(open(p)) for p in sys.argv[1:])
print("   first loss bf16 logits %.9f, fp32 logits %.9f" % (b["losses"][0], f["losses"][0]))
assert b["losses"][0] != f["losses"][0], "the bf16-logits path did not run"
assert b["memory"]["plan_bytes"] == f["memory"]["plan_bytes"]
PY
then ok "head_bf16_logits: bf16 logits within the step tolerance of fp32 logits, and not the same run"
else bad "head_bf16_logits"; tail -3 "$W/bf16_f32logits.log"; fi

# 9. Muon's Newton-Schulz on bf16 operands (knob muon_ns_bf16, default 1; docs/model.md
#    "Muon"): against the fp32 iteration (=0, SPEC's), both within the step tolerance of the
#    fp32 run (bf16_curve.py --other), the same first loss (no update yet) and a different
#    second (the bf16 iteration ran: its GEMMs, 15 a step per Muon matrix on the fp32 gemm
#    entry, became 15 gemm_bf16_batched calls a step per batch of same-shape matrices, fewer
#    calls than matrices; the momentum, norm and rounding of a batch's matrices in one
#    muon_prep_bf16_multi, their updates in one axpby_from_bf16_multi, no per-matrix pass,
#    no transpose)
if run 1 "$W/bf16_nsfp32" $DENSE --set precision=bf16 --knob muon_ns_bf16=0 &&
   python3 "$HERE/bf16_curve.py" "$W/fp32/receipt.json" "$W/bf16/receipt.json" --other "$W/bf16_nsfp32/receipt.json" &&
   python3 - "$W/bf16/receipt.json" "$W/bf16_nsfp32/receipt.json" <<'PY'
import json, sys
b, f = (json.load(open(p)) for p in sys.argv[1:])
print("   losses 1-2 bf16 iteration %s, fp32 iteration %s" % (b["losses"][:2], f["losses"][:2]))
assert b["losses"][0] == f["losses"][0] and b["losses"][1] != f["losses"][1], "the bf16 iteration did not run"
assert b["knobs"]["muon_ns_bf16"]["value"] == "1" and f["knobs"]["muon_ns_bf16"]["value"] == "0"
assert b["backend"]["muon_newton_schulz"] == "bf16", b["backend"]
assert f["backend"]["muon_newton_schulz"] == "fp32", f["backend"]
# the iteration's GEMMs, 15 a step per Muon matrix on the fp32 gemm entry, batched in bf16
eb, ef = ({e["name"]: e["calls_per_step"] for e in r["timing"]["op_profile_by_entry"]} for r in (b, f))
mats, batched = ef["gemm"] / 15, eb.get("gemm_bf16_batched", 0)
print("   calls a step: gemm %s / %s, gemm_bf16_batched %s / %s (%g Muon matrices), gemm_bf16 %s / %s"
      % (eb.get("gemm"), ef.get("gemm"), batched, ef.get("gemm_bf16_batched"), mats, eb["gemm_bf16"], ef["gemm_bf16"]))
assert eb.get("gemm", 0) == 0 < ef["gemm"] and eb["gemm_bf16"] == ef["gemm_bf16"], (eb, ef)
assert ef.get("gemm_bf16_batched", 0) == 0 and batched % 15 == 0 and 15 <= batched < ef["gemm"], (eb, ef)
assert eb["muon_prep_bf16_multi"] == eb["axpby_from_bf16_multi"] == batched / 15 < mats, (eb, ef)
assert not any(eb.get(k) for k in ("normalize_fro_bf16", "axpby_from_bf16", "muon_momentum", "transpose")), eb
assert not ef.get("muon_prep_bf16_multi") and not ef.get("axpby_from_bf16_multi") and ef["transpose"] > 0, (eb, ef)
PY
then ok "muon_ns_bf16: the Newton-Schulz iteration on bf16 operands within the step tolerance of the fp32 one," \
        "and not the same run"
else bad "muon_ns_bf16"; tail -3 "$W/bf16_nsfp32.log"; fi

echo "test_bf16_train: $(( $(date +%s) - t0 ))s"
finish
