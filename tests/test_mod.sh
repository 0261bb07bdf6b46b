#!/usr/bin/env bash
# test_mod.sh BUILD_DIR — Mixture-of-Depths routed blocks (issue 31, SPEC 1e;
# docs/model.md "Mixture-of-Depths").
#  1. the receipt: series mod_aux_losses after z_losses (weight mod_aux_coef,
#     per token), losses = the parts' sum, the mod block (capacity, rows C per
#     sequence, routed layers); at step 0 (r near 0 for every token) mod_aux
#     is close to coef x layers x log 2; a pattern without lowercase letters
#     has neither;
#  2. equivalence with one rank (tests/equiv.py at 1e-6: losses, lm/aux/z,
#     grad norms, every final tensor, the routers included; the mod_aux series
#     at 1e-6 relative): dense AaAa on dp=2 ZeRO-0/1/3, tp=2 (SP off:
#     whole sequences on every model rank; SP on: the scores gathered, every
#     rank selects the same rows and runs its share of them), dp=2 x tp=2
#     ZeRO-1/3, pp=2, pp=2 x dp=2 ZeRO-3, pp=2 x tp=2 and the 8-rank
#     pp=2 x dp=2 x tp=2; MoE AeAe (the routed experts see only the selected
#     tokens) on ep=2, dp=2 x ep=2, tp=2 (SP on and off), ep=2 x tp=2 and the
#     8-rank dp=2 x ep=2 x tp=2; the replica hashes with the pair count of
#     tests/replica_pairs.py;
#  3. a dp=2 x tp=2 checkpoint resumes on one rank; precision=bf16 tracks fp32
#     within 1%; recompute=block is bit-identical (the selection re-made);
#     mod_capacity=1 runs every token through the block, at sigmoid(r) weight:
#     different from the unrouted pattern, and each layer's aux then only
#     pushes r up;
#     LoRA (the routers frozen) on tp=2 and dp=2 x tp=2 equals one rank;
#  4. bad input, one line on every rank, exit 2, nothing written: an MTP
#     module block that is routed, B*C not divisible by tp.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_mod.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
BASE="--set vocab_size=64 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20 --set mod_capacity=0.25 --set mod_aux_coef=0.05"
DENSE="$BASE --set pattern=AaAa"
MOE="$BASE --set pattern=AeAe --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"
NOSP="--set sequence_parallel=false"

# mod_same REF RUN : the mod_aux series equal at 1e-6 relative
mod_same() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(f + "/receipt.json"))["mod_aux_losses"] for f in sys.argv[1:])
d = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
print("   mod_aux_losses max rel %.2e" % d)
assert len(a) == len(b) == 20 and d <= 1e-6
PY
}

# ---- 1: the receipt ----
if run 1 "$W/DENSE_ref" $DENSE --steps 20 && python3 - "$W/DENSE_ref/receipt.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
names = [p["name"] for p in r["loss_parts"]]
assert names == ["lm", "aux", "z", "mod_aux"], names
p = r["loss_parts"][3]
assert abs(p["weight"] - 0.05) < 1e-7 and p["divided_by"] == "tokens" and p["backward"], p
for i, L in enumerate(r["losses"]):
    s = r["lm_losses"][i] + r["aux_losses"][i] + r["z_losses"][i] + r["mod_aux_losses"][i]
    assert abs(L - s) <= 1e-12 * abs(L), (i, L, s)
m = r["mod"]
assert m["capacity"] == 0.25 and m["rows_per_sequence"] == 4 and m["seq_len"] == 16 and m["routed_layers"] == [1, 3], m
a0 = r["mod_aux_losses"][0]
print("   mod_aux step 0 %.5f (coef x 2 layers x log 2 = %.5f), last %.5f" % (a0, 0.05 * 2 * math.log(2),
                                                                           r["mod_aux_losses"][-1]))
assert abs(a0 - 0.05 * 2 * math.log(2)) < 0.01
PY
then ok "receipt: mod_aux series (weight 0.05, per token), losses = the parts' sum, the mod block"
else bad "receipt of pattern=AaAa"; tail -3 "$W/DENSE_ref.log"; fi
if run 1 "$W/off" ${BASE} --steps 2 && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
assert 'mod_aux_losses' not in r and 'mod' not in r and [p['name'] for p in r['loss_parts']]==['lm','aux','z']" \
    "$W/off/receipt.json"; then
    ok "an unrouted pattern: no mod_aux series, no mod block"
else bad "unrouted receipt"; fi

# ---- 2: equivalence ----
floor "$W/DENSE_ref" 2 $DENSE --steps 20
for name in DENSE MOE; do
    cfg=${!name}
    [ $name = MOE ] && { run 1 "$W/MOE_ref" $cfg --steps 20 || { bad "MOE reference"; continue; }; }
    while read -r np mesh zero extra; do
        [ -z "$np" ] && continue
        mesh_row "$name" "$cfg" mod_same "$np" "$mesh" "$zero" $extra
    done <<<"$([ $name = DENSE ] && printf '%s\n' "2 dp=2 0" "2 dp=2 1" "2 dp=2 3" "2 tp=2 0 $NOSP" "2 tp=2 0" \
        "4 dp=2,tp=2 3 $NOSP" "4 dp=2,tp=2 3" "4 dp=2,tp=2 1 $NOSP" "2 pp=2 0 --set microbatches=2" \
        "4 pp=2,dp=2 3 --set microbatches=2" "4 pp=2,tp=2 1 --set microbatches=2 $NOSP" "4 pp=2,tp=2 1 --set microbatches=2" \
        "8 pp=2,dp=2,tp=2 1 --set microbatches=2 $NOSP" ||
        printf '%s\n' "2 ep=2 0" "4 dp=2,ep=2 1" "2 tp=2 0 $NOSP" "2 tp=2 0" "4 ep=2,tp=2 1" \
        "8 dp=2,ep=2,tp=2 1 $NOSP")"
done

# ---- 3: resume, bf16, recompute, capacity 1 ----
if run 4 "$W/part" $DENSE --steps 10 --mesh dp=2,tp=2 --zero 1 $NOSP && run 1 "$W/cont" $DENSE --steps 20 --resume "$W/part" &&
   close "$W/DENSE_ref" "$W/cont" 1e-6 10; then
    ok "a dp=2 x tp=2 checkpoint resumes on one rank with the uninterrupted losses"
else bad "dp=2 x tp=2 -> one rank resume"; tail -3 "$W/cont.log"; fi

if run 1 "$W/bf16" $DENSE --steps 20 --set precision=bf16 && python3 - "$W/DENSE_ref" "$W/bf16" <<'PY'
import json, sys
a, b = (json.load(open(f + "/receipt.json")) for f in sys.argv[1:])
for k in ("lm_losses", "mod_aux_losses"):
    d = max(abs(x - y) / abs(x) for x, y in zip(a[k], b[k]))
    print("   %s: bf16 vs fp32 max rel %.2e" % (k, d))
    assert d < 1e-2, k
assert b["lm_losses"][-1] < b["lm_losses"][0]
PY
then ok "precision=bf16: the series track fp32 within 1%"
else bad "precision=bf16 with MoD"; tail -3 "$W/bf16.log"; fi

if run 1 "$W/recompute" $DENSE --steps 20 --set recompute=block && close "$W/DENSE_ref" "$W/recompute" 0 &&
   python3 -c "import json,sys; a,b=(json.load(open(f+'/receipt.json')) for f in sys.argv[1:]); \
assert a['mod_aux_losses']==b['mod_aux_losses']" "$W/DENSE_ref" "$W/recompute"; then
    ok "recompute=block: bit-identical to recompute=none, series and parameters"
else bad "recompute=block with MoD"; fi

if run 1 "$W/full" ${DENSE/mod_capacity=0.25/mod_capacity=1} --steps 20 && run 1 "$W/plain" ${DENSE/pattern=AaAa/pattern=AAAA} --steps 20 &&
   differs "$W/full" "$W/plain" && python3 - "$W/full" <<'PY'
import json, sys
r = json.load(open(sys.argv[1] + "/receipt.json"))
a = r["mod_aux_losses"]
print("   capacity 1: mod_aux %.5f -> %.5f" % (a[0], a[-1]))
assert r["mod"]["rows_per_sequence"] == 16 and a[-1] < a[0]   # every token selected: the aux pushes r up
PY
then ok "mod_capacity=1: every token runs the block at weight sigmoid(r), unlike the unrouted pattern"
else bad "mod_capacity=1"; fi

# ---- 4: bad input ----
# LoRA: the routers are frozen base tensors; the adapters inside the routed blocks train on the selected rows
if run 1 "$W/lora_ref" $DENSE --set lora_rank=2 --steps 20 && differs "$W/lora_ref" "$W/DENSE_ref"; then
    for row in "2 tp=2 0" "4 dp=2,tp=2 1 $NOSP"; do
        set -- $row; np=$1 mesh=$2 zero=$3; shift 3
        o="$W/lora_${mesh//[=,]/_}_z$zero"
        if run "$np" "$o" $DENSE --set lora_rank=2 --steps 20 --mesh "$mesh" --zero "$zero" "$@" &&
           close "$W/lora_ref" "$o" 1e-6 && hash_ok "$o"; then
            ok "LoRA on AaAa --mesh $mesh zero=$zero $* equals the single-rank losses"
        else bad "LoRA on AaAa --mesh $mesh zero=$zero $*"; tail -3 "$o.log"; fi
    done
else bad "LoRA on AaAa: one-rank reference"; tail -3 "$W/lora_ref.log"; fi
viol 1 dp=1 'mtp_block=a is a routed' $DENSE --set mtp_depth=1 --set mtp_block=a
viol 2 tp=2 'the routed rows B\*C=1\*1 must divide by tp' $DENSE $NOSP --set batch_size=1 --set mod_capacity=0.01
finish
