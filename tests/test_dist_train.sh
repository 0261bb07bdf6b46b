#!/usr/bin/env bash
# test_dist_train.sh BUILD_DIR — data parallel + ZeRO 0-3 under mpirun (issue 4).
#
#  1. equivalence: dense and MoE tiny configs, np=2 and np=4, ZeRO 0..3 equal
#     the single-rank run over 20 steps (microbatches=2 for MoE, so gradient
#     accumulation is covered too): tests/equiv.py compares the losses (1e-6
#     relative), lm/aux/z losses, grad norms and every final parameter;
#  2. ZeRO-1 equals ZeRO-0 bit for bit, series and params (same reductions,
#     same update math); data_order=shuffled and logit_softcap=15 (each checked
#     to change the run) on np=2 equal their single-rank runs;
#  3. after 50 steps every replicated tensor hashes the same on every rank
#     (receipt replica_hash_check, ZeRO 0/1/2), after exactly the number of
#     comparisons the mesh implies (tests/replica_pairs.py); one replica moved
#     by one ulp (MT_FAULT=rank:step:replica) ends the run with exit 1 naming
#     the tensor, the ranks and the count (dp, dp x tp, dp x ep, pp x dp);
#     ZeRO-3 on dp=2 x tp=2 without SP compares the owners' copies (one per
#     model rank) of the residual tensors, with SP "not applicable";
#     replica_check_every=10 checks after steps 10..40 too (the receipt's
#     replica_checks, each equal to the final result), and a moved replica
#     ends the run at the next periodic check, naming the step;
#  4. measured per-rank memory: params, grads and optimizer state shrink as
#     the stage goes up;
#  5. resume on the same mesh is bit-exact; a checkpoint saved on np=2 ZeRO-3
#     resumes on np=4 ZeRO-1 and on one rank with the uninterrupted losses;
#  6. bad mesh input: one line, exit 2, on every rank, no hang;
#  7. faults: a non-finite gradient and a failed rank (error, SIGKILL) end the
#     job with a message within 30 s.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_dist_train.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20"
MOE="$DENSE --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

# ---- 1 + 2: equivalence ----
for name in DENSE MOE; do
    cfg=${!name}
    run 1 "$W/${name}_ref" $cfg --steps 20 || { bad "$name single-rank run"; cat "$W/${name}_ref.log"; continue; }
    floor "$W/${name}_ref" $([ $name = DENSE ] && echo 2 || echo 4) $cfg --steps 20
    for np in 2 4; do
        for z in 0 1 2 3; do
            o="$W/${name}_np${np}_z$z"
            if run "$np" "$o" $cfg --steps 20 --zero $z && close "$W/${name}_ref" "$o" 1e-6; then
                ok "$name np=$np zero=$z equals the single-rank losses"
            else
                bad "$name np=$np zero=$z equals the single-rank losses"; tail -5 "$o.log"
            fi
        done
        if close "$W/${name}_np${np}_z0" "$W/${name}_np${np}_z1" 0; then
            ok "$name np=$np ZeRO-1 == ZeRO-0 bit for bit (series and final params)"
        else bad "$name np=$np ZeRO-1 == ZeRO-0 bit for bit"; fi
    done
    # the step-0 trace: one line per rank, with groups and predicates
    n=$(grep -c '^mesh rank=[0-3] coord(pipe=0,data=[0-3],expert=0,model=0) world{size=4 .* data_expert{size=4 .*dp_active=1 .*zero_stage=3' "$W/${name}_np4_z3.log")
    [ "$n" = 4 ] && ok "$name trace line on every rank" || bad "$name trace line on every rank ($n)"
done

# ---- 1b: shuffled data order and a logit softcap, dp=2 vs one rank ----
# each variant must change the single-rank run (else it proves nothing), and
# then the dp=2 run must equal that single-rank run. The shuffled run stops at
# 10 steps: from step 11 on this trajectory amplifies association noise 10x
# (its one-rank floor reaches 1.3e-6 on the loss; docs/testing.md)
for v in "shuf 10 --set data_order=shuffled" "cap 20 --set logit_softcap=15"; do
    set -- $v; tag=$1 n=$2; shift 2
    run 1 "$W/${tag}_ref" $DENSE "$@" --steps $n && run 2 "$W/${tag}_dp2" $DENSE "$@" --steps $n --zero 1 || \
        { bad "$tag runs"; continue; }
    floor "$W/${tag}_ref" 2 $DENSE "$@" --steps $n
    if differs "$W/${tag}_ref" "$W/DENSE_ref" && close "$W/${tag}_ref" "$W/${tag}_dp2" 1e-6; then
        ok "DENSE $* : changes the run, and np=2 ZeRO-1 equals one rank"
    else bad "DENSE $* : np=2 ZeRO-1 equals one rank (and differs from the default)"; fi
done

# ---- 1c: hybrid model (M blocks next to A and E), dp=2 ZeRO 0-3 vs one rank ----
# Hybrid (M = Mamba-3 blocks, issue 15): grad_clip=0, because with clipping
# this trajectory switches the clip factor around gn = 1 at steps 9-17 and its
# own one-rank floor reaches 5.6e-5 on the grad norms (the floor check below
# keeps that honest); chunk 8 with ngroups 2 (the model axis splits groups).
# HYB_TOL 2e-6 (bounds: loss 2e-6, grad norms 2e-5): without clipping the
# hybrid trajectory still amplifies the grad norm's association noise at
# steps 7-13 to 3-7.5e-6 one-rank (AVX-512 kernels), past half of 1e-5
# (docs/testing.md); the loss floor stays at 3e-7
HYB_TOL=2e-6
HYB="$DENSE --set n_layer=4 --set pattern=AMEM --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8 --set microbatches=2 --set grad_clip=0"
if run 1 "$W/HYB_ref" $HYB --steps 20; then
    TOL=$HYB_TOL floor "$W/HYB_ref" 4 $HYB --steps 20
    for z in 0 1 2 3; do
        o="$W/HYB_np2_z$z"
        if run 2 "$o" $HYB --steps 20 --zero $z && close "$W/HYB_ref" "$o" $HYB_TOL; then
            ok "HYB (AMEM) np=2 zero=$z equals the single-rank losses"
        else bad "HYB (AMEM) np=2 zero=$z equals the single-rank losses"; tail -5 "$o.log"; fi
    done
else bad "HYB single-rank run"; cat "$W/HYB_ref.log"; fi

# ---- 3: replica hashes after 50 steps, and a perturbed replica is caught ----
# (replica_check_every=10: also after steps 10..40, each result the final one's)
for z in 0 1 2; do
    o="$W/hash_z$z"
    if run 4 "$o" $MOE --set total_steps=50 --steps 50 --zero $z --set replica_check_every=10 && hash_ok "$o" &&
       python3 - "$o/receipt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); c = r["replica_checks"]
print("   periodic checks after steps", [x["step"] for x in c["checks"]])
assert c["every"] == 10 and [x["step"] for x in c["checks"]] == [10, 20, 30, 40], c
assert all(x["result"] == r["replica_hash_check"] for x in c["checks"]), c
PY
    then
        ok "replica hashes agree after 50 steps and every 10, every expected pair compared (ZeRO-$z)"
    else bad "replica hashes agree after 50 steps and every 10 (ZeRO-$z)"; fi
done
# ZeRO-3 hashes the owners' copies: on dp=2 x tp=2 without SP the residual
# stream's tensors have one owner per model rank (tests/replica_pairs.py
# derives the pairs); with SP every tensor has one owner: "not applicable"
o="$W/hash_z3"
if run 4 "$o" $MOE --set total_steps=10 --steps 10 --zero 3 --mesh dp=2,tp=2 --set sequence_parallel=false \
    --set replica_check_every=5 && hash_ok "$o" && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
c=r['replica_checks']['checks']; assert [x['step'] for x in c]==[5] and c[0]['result']==r['replica_hash_check'], c" \
    "$o/receipt.json"; then
    ok "ZeRO-3 dp=2 x tp=2 without SP: the owners' copies of the residual tensors agree, every expected pair compared"
else bad "ZeRO-3 dp=2 x tp=2 without SP: replica hashes"; tail -3 "$o.log"; fi
o="$W/hash_z3sp"
if run 4 "$o" $MOE --set total_steps=4 --steps 4 --zero 3 --mesh dp=2,tp=2 && python3 -c "import json,sys; \
h=json.load(open(sys.argv[1]))['replica_hash_check']; print('   '+h); assert h.startswith('not applicable: ZeRO-3') and '(0 rank pairs)' in h" \
    "$o/receipt.json" && [ "$(python3 "$HERE/replica_pairs.py" "$o")" = 0 ]; then
    ok "ZeRO-3 dp=2 x tp=2 with SP: one owner per tensor, the check says not applicable (0 pairs derived)"
else bad "ZeRO-3 dp=2 x tp=2 with SP: not applicable"; fi
hash_fault 2 dp=2 0 $MOE
hash_fault 4 dp=2,tp=2 1 $MOE
hash_fault 4 dp=2,ep=2 2 $MOE
hash_fault 4 pp=2,dp=2 0 $MOE
# the periodic check ends the run at the check right after the fault (step 3
# of 9: under ZeRO-1 the next all-gather would overwrite a non-owner's copy),
# every rank naming the step and the tensor; no receipt (no final check ran)
o="$W/hfault_periodic"
MT_FAULT=1:2:replica "${MPIRUN[@]}" -x MT_FAULT -np 4 "$MT" train $MOE $COMMON --out "$o" --steps 9 --mesh dp=2,tp=2 \
    --zero 1 --set replica_check_every=3 >"$o.log" 2>&1 </dev/null
rc=$?
n=$(grep -c "meshtrain train: replica hash check after step 3 failed: MISMATCH: model\.[a-z_.0-9]*weight differs: ranks 1 vs rank 0" "$o.log")
if [ $rc -eq 1 ] && [ "$n" -ge 1 ] && ! grep -q "after step [69]" "$o.log"; then
    ok "replica_check_every=3: a replica moved in step 3 of 9 ends the run after it, naming step and tensor"
else bad "replica_check_every=3 fault (rc=$rc, $n lines)"; tail -5 "$o.log"; fi

# ---- 4: memory shrinks with the stage (measured, rank 0, np=4) ----
python3 - "$W"/DENSE_np4_z{0,1,2,3}/receipt.json <<'PY' && ok "params/grads/optim shrink with the ZeRO stage" || bad "params/grads/optim shrink with the ZeRO stage"
import json, sys
m = [json.load(open(p))["distributed"]["memory_peak_bytes_per_rank"] for p in sys.argv[1:]]
def tot(z, b): return sum(r[b] for r in m[z]) / len(m[z])   # mean over ranks
P0 = tot(0, "params")
print("   mean bytes/rank  params", [int(tot(z, "params")) for z in range(4)],
      " grads", [int(tot(z, "grads")) for z in range(4)], " optim", [int(tot(z, "optim")) for z in range(4)])
assert tot(1, "optim") < 0.4 * tot(0, "optim")              # stage 1: optimizer state / 4 (+ balance)
assert abs(tot(1, "params") - P0) < 1e-9 * P0 + 1           # params still full
assert tot(2, "grads") < 0.6 * tot(1, "grads")              # stage 2: owned grads + 2 unit scratch buffers
assert tot(3, "params") < 0.4 * P0                          # stage 3: owned params only
libs = json.load(open(sys.argv[1]))["distributed"]["comm_libraries"]   # the MPI library's own line
assert libs and not libs.startswith("no MPI") and "NCCL" not in libs, libs
PY

# ---- 5: resume and resharding ----
run 2 "$W/full" $MOE --steps 12 --zero 3 && run 2 "$W/part" $MOE --steps 6 --zero 3 && \
run 2 "$W/part" $MOE --steps 12 --zero 3 --resume "$W/part" || bad "resume runs"
if close "$W/full" "$W/part" 0 6; then
    ok "np=2 ZeRO-3: 6 + resume + 6 steps == 12 steps, bit for bit (series and final params)"
else bad "np=2 ZeRO-3: 6 + resume + 6 steps == 12 steps, bit for bit"; fi
for target in "4 1" "1 0"; do
    set -- $target
    o="$W/reshard_np$1"
    if run "$1" "$o" $MOE --steps 12 --zero "$2" --resume "$W/part/ckpt/step_000006" && close "$W/full" "$o" 1e-6 6; then
        ok "np=2 ZeRO-3 checkpoint resumes on np=$1 ZeRO-$2"
    else bad "np=2 ZeRO-3 checkpoint resumes on np=$1 ZeRO-$2"; fi
done
python3 - "$W/part/ckpt/step_000012/manifest.json" <<'PY' && ok "manifest records the mesh it was saved from" || bad "manifest records the mesh"
import json, sys
m = json.load(open(sys.argv[1])); assert m["meta"]["mesh"] == "pp=1,dp=2,ep=1,tp=1", m["meta"]["mesh"]
PY

# ---- 6: bad mesh input: one line, exit 2, every rank, nothing written ----
for m in "dp=3" "foo=2" "dp=0" "dp=-1" "tp=3"; do
    o="$W/badmesh"
    rm -rf "$o"
    "${MPIRUN[@]}" -np 4 "$MT" train $DENSE $COMMON --out "$o" --steps 2 --mesh "$m" >"$o.out" 2>"$o.err"
    rc=$?
    nl=$(grep -c '^meshtrain train: ' "$o.err")
    if [ $rc -eq 2 ] && [ "$nl" -eq 4 ] && [ ! -e "$o" ]; then ok "--mesh $m: exit 2, one line on each of 4 ranks"
    else bad "--mesh $m: rc=$rc lines=$nl"; cat "$o.err"; fi
done
"${MPIRUN[@]}" -np 2 "$MT" train $DENSE --set batch_size=3 $COMMON --out "$W/badb" --steps 2 >/dev/null 2>"$W/badb.err"
rc=$?
[ $rc -eq 2 ] && [ "$(grep -c 'mesh contract: batch_size % (dp\*ep\*microbatches) != 0 (batch_size=3, dp=2' "$W/badb.err")" -eq 2 ] \
    && ok "contract violation (batch 3 on dp=2): exit 2 on every rank" || { bad "contract violation batch"; cat "$W/badb.err"; }

# ---- 7: faults end the job, with a message, fast ----
fault() { # fault SPEC EXPECT_REGEX NAME
    local t0=$SECONDS
    MT_FAULT=$1 "${MPIRUN[@]}" -x MT_FAULT -np 2 "$MT" train $DENSE $COMMON --out "$W/fault" --steps 10 --zero 2 >"$W/fault.log" 2>&1
    local rc=$? dt=$((SECONDS - t0))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $dt -le 30 ] && grep -Eq "$2" "$W/fault.log"; then ok "$3 (rc=$rc, ${dt}s)"
    else bad "$3 (rc=$rc, ${dt}s)"; cat "$W/fault.log"; fi
}
fault 1:3:nan 'non-finite gradient on rank 1 in parameter model\.norm\.weight at step 3' "non-finite gradient stops the job naming rank, parameter, step"
fault 1:3:error 'injected failure \(MT_FAULT\) on rank 1 at step 3' "a rank's error brings the job down"
fault 0:2:signal 'exited on signal 9|killed|Killed' "a killed rank brings the job down"


# ---- 8: null experts (SPEC 1e): the router's E + Z rows, dp=2 ZeRO-1 and ZeRO-3 vs one rank ----
NULLX="$MOE --set n_null_experts=2 --set top_k=3"
if run 1 "$W/NULLX_ref" $NULLX --steps 20 && differs "$W/NULLX_ref" "$W/MOE_ref"; then
    floor "$W/NULLX_ref" 4 $NULLX --steps 20
    for z in 1 3; do
        o="$W/NULLX_np2_z$z"
        if run 2 "$o" $NULLX --steps 20 --zero $z && close "$W/NULLX_ref" "$o" 1e-6; then
            ok "NULLX (2 null experts) np=2 zero=$z equals the single-rank losses"
        else bad "NULLX (2 null experts) np=2 zero=$z"; tail -5 "$o.log"; fi
    done
else bad "NULLX reference (or null experts changed nothing)"; tail -5 "$W/NULLX_ref.log"; fi

finish
