#!/usr/bin/env bash
# test_long_equiv.sh BUILD_DIR — what equivalence promises over a long run
# (issue 33 item 8; docs/testing.md "Equivalence over long runs"). A 2-rank
# ZeRO-2 hybrid MoE run (pattern MEAM) of 340 steps against one rank:
#  - the replica hash is checked at every checkpoint: the 2-rank run goes in
#    four segments (100, 200, 300, 340), each resumed from the previous one's
#    checkpoint (same-mesh resume is bit-exact, test_dist_train.sh) and each
#    ending in the replica check, which must say ok;
#  - the per-step relative loss difference to one rank follows the noise
#    floor's curve: the floor is the same one-rank run with microbatches=2,
#    whose only change is the association of the gradient sums, the kind of
#    change the 2-rank run makes. While the floor's running maximum is below
#    1e-2 (the trajectories are still one trajectory), the 2-rank running
#    maximum must stay within 10x the floor's (+1e-7);
#  - once decorrelated (the floor reaches 1e-2 near step 100), single steps
#    are no longer comparable; the 50-step mean losses must agree with one
#    rank within max(3 x the floor's own difference, 2e-3) relative, the
#    floor's window difference taken as the larger of two re-associations
#    (microbatches=2 and 4): one sample of a window mean's noise can be small
#    by chance (2026-11-28, an AVX-512 host: mb2 7.6e-5, mb4 1.4e-3, mb8 4.0e-3
#    on steps 50-99, where 2 ranks were 2.2e-3 off, on this build and the
#    previous one alike).
# Measured (docs/testing.md): both curves first pass 1e-6 at step 16, 1e-4 at
# step 59, 1e-2 near step 100; window means within 1.1e-3 (floor 3.1e-3).
set -u
BUILD=${1:?usage: test_long_equiv.sh BUILD_DIR}
MPIRUN_TIMEOUT=${MPIRUN_TIMEOUT:-300}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
HYB="--set vocab_size=64 --set n_layer=4 --set pattern=MEAM --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=340 --set n_experts=4 --set top_k=2 --set expert_hidden=16 --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

run 1 "$W/r1" $HYB --steps 340 || { bad "one rank: $(tail -2 "$W/r1.log")"; finish; exit 1; }
run 1 "$W/mb2" $HYB --set microbatches=2 --steps 340 || { bad "floor: $(tail -2 "$W/mb2.log")"; finish; exit 1; }
run 1 "$W/mb4" $HYB --set microbatches=4 --steps 340 || { bad "floor 2: $(tail -2 "$W/mb4.log")"; finish; exit 1; }
prev=""
for s in 100 200 300 340; do
    run 2 "$W/dp2_$s" $HYB --mesh dp=2 --zero 2 --steps $s ${prev:+--resume "$prev"} ||
        { bad "2 ranks to step $s: $(tail -2 "$W/dp2_$s.log")"; finish; exit 1; }
    if python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if str(r['replica_hash_check']).startswith('ok') else 1)" \
        "$W/dp2_$s/receipt.json"; then ok "replica hash at the step-$s checkpoint: ok"
    else bad "replica hash at step $s: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['replica_hash_check'])" "$W/dp2_$s/receipt.json")"; fi
    prev="$W/dp2_$s"
done

python3 - "$W" <<'PY' && ok "340 steps: the 2-rank drift follows the floor's curve, window means agree" || bad "long-run drift"
import json, sys
W = sys.argv[1]
ld = lambda d: json.load(open(f"{W}/{d}/receipt.json"))["losses"]
r1, mb2, mb4 = ld("r1"), ld("mb2"), ld("mb4")
dp2 = ld("dp2_100") + ld("dp2_200") + ld("dp2_300") + ld("dp2_340")
assert len(r1) == len(mb2) == len(dp2) == 340, (len(r1), len(mb2), len(dp2))
rel = lambda a, b: [abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)]
f, d = rel(r1, mb2), rel(r1, dp2)
ok, ef, ed = True, 0.0, 0.0
for s in range(340):
    ef, ed = max(ef, f[s]), max(ed, d[s])
    if ef < 1e-2 and ed > 10 * ef + 1e-7:
        print(f"   step {s}: 2-rank drift {ed:.3g} above 10 x the floor's {ef:.3g}: FAIL"); ok = False; break
first = lambda c, t: next((i for i, x in enumerate(c) if x > t), None)
print("   first step above 1e-6 / 1e-4 / 1e-2: floor %s %s %s, 2 ranks %s %s %s" % tuple(
    first(c, t) for c in (f, d) for t in (1e-6, 1e-4, 1e-2)))
for w in range(0, 340, 50):
    m = lambda v: sum(v[w:w + 50]) / len(v[w:w + 50])
    a, c = m(r1), m(dp2)
    fl = max(abs(m(mb2) - a), abs(m(mb4) - a)) / a   # the floor's window difference: the larger of two samples
    lim = max(3 * fl, 2e-3)
    good = abs(c - a) / a <= lim
    print("   steps %3d-%3d: mean loss %.5f, 2 ranks %.2e relative (floor %.2e, bound %.2e)%s" % (
        w, min(w + 50, 340) - 1, a, abs(c - a) / a, fl, lim, "" if good else ": FAIL"))
    ok &= good
sys.exit(0 if ok else 1)
PY
finish
