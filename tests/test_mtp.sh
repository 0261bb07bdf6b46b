#!/usr/bin/env bash
# test_mtp.sh BUILD_DIR — multi-token prediction (issue 31, SPEC 1e; docs/model.md "MTP").
#  1. the receipt: series mtp_1_losses, mtp_2_losses after z_losses, each
#     weighted lambda/Dm (0.15), divided by "targets k ahead"; each step's loss
#     = lm + aux + z + mtp_1 + mtp_2; mtp_depth=0 has no such series;
#  2. equivalence with one rank (tests/equiv.py at 1e-6: losses, lm/aux/z,
#     grad norms, every final parameter, the MTP modules' included; and the
#     mtp_k series at 1e-6 relative): dp=2 ZeRO-0/1/3, tp=2 with SP on and
#     off, tp=2 x dp=2 ZeRO-3, pp=2 (the depths' embedding rows travel in the
#     stage exchange's tail), pp=2 x dp=2 ZeRO-3, pp=2 x tp=2, MoE (AE,
#     mtp_block A) on ep=2 and dp=2 x ep=2, and the 8-rank dp=2 x ep=2 x tp=2
#     and pp=2 x dp=2 x tp=2; the replica hashes (the modules'
#     gains and eh_proj are whole on every model rank) with the pair count of
#     tests/replica_pairs.py;
#  3. a checkpoint of tp=2 x dp=2 resumes on one rank with the losses of the
#     uninterrupted run (the modules' tensors reshard like every tensor);
#     precision=bf16 tracks fp32 within 1%; recompute=block is bit-identical;
#     LoRA (the modules frozen, their blocks' adapters trained) on tp=2, pp=2
#     and dp=2 x tp=2 equals one rank;
#  4. bad input, one line, exit 2, nothing written: mtp_block a routed kind
#     (E), an unknown letter, mtp_depth above 4, seq_len <= mtp_depth.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_mtp.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20 --set mtp_depth=2"
MOE="$DENSE --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

# mtp_same REF RUN : the mtp_k series equal at 1e-6 relative
mtp_same() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(f + "/receipt.json")) for f in sys.argv[1:])
for k in ("mtp_1_losses", "mtp_2_losses"):
    d = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a[k], b[k]))
    print("   %s max rel %.2e" % (k, d))
    assert len(a[k]) == len(b[k]) == 20 and d <= 1e-6, k
PY
}

# ---- 1: the receipt ----
if run 1 "$W/DENSE_ref" $DENSE --steps 20 && python3 - "$W/DENSE_ref/receipt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
names = [p["name"] for p in r["loss_parts"]]
assert names == ["lm", "aux", "z", "mtp_1", "mtp_2"], names
for p in r["loss_parts"][3:]:
    assert abs(p["weight"] - 0.15) < 1e-7 and p["divided_by"] == "targets k ahead" and p["backward"], p
for i, L in enumerate(r["losses"]):
    s = r["lm_losses"][i] + r["aux_losses"][i] + r["z_losses"][i] + r["mtp_1_losses"][i] + r["mtp_2_losses"][i]
    assert abs(L - s) <= 1e-12 * abs(L), (i, L, s)
assert r["mtp_1_losses"][-1] < r["mtp_1_losses"][0] and r["mtp_2_losses"][-1] < r["mtp_2_losses"][0]
print("   mtp_1 %.4f -> %.4f, mtp_2 %.4f -> %.4f" % (r["mtp_1_losses"][0], r["mtp_1_losses"][-1],
                                                  r["mtp_2_losses"][0], r["mtp_2_losses"][-1]))
PY
then ok "receipt: mtp_1/mtp_2 series (weight 0.15, per target k ahead), losses = the parts' sum, both fall"
else bad "receipt of mtp_depth=2"; tail -3 "$W/DENSE_ref.log"; fi
if run 1 "$W/off" ${DENSE/--set mtp_depth=2/} --steps 2 && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
assert 'mtp_1_losses' not in r and [p['name'] for p in r['loss_parts']]==['lm','aux','z']" "$W/off/receipt.json"; then
    ok "mtp_depth=0: no MTP series, no MTP part"
else bad "mtp_depth=0 receipt"; fi

# ---- 2: equivalence ----
floor "$W/DENSE_ref" 2 $DENSE --steps 20
for name in DENSE MOE; do
    cfg=${!name}
    [ $name = MOE ] && { run 1 "$W/MOE_ref" $cfg --steps 20 || { bad "MOE reference"; continue; }; }
    while read -r np mesh zero extra; do
        [ -z "$np" ] && continue
        mesh_row "$name" "$cfg" mtp_same "$np" "$mesh" "$zero" $extra
    done <<<"$([ $name = DENSE ] && printf '%s\n' "2 dp=2 0" "2 dp=2 1" "2 dp=2 3" "2 tp=2 0" \
        "2 tp=2 0 --set sequence_parallel=false" "4 dp=2,tp=2 3 --set sequence_parallel=false" "4 dp=2,tp=2 3" \
        "2 pp=2 0 --set microbatches=2" "4 pp=2,dp=2 3 --set microbatches=2" "4 pp=2,tp=2 1 --set microbatches=2" \
        "8 pp=2,dp=2,tp=2 1 --set microbatches=2" ||
        printf '%s\n' "2 ep=2 0" "4 dp=2,ep=2 1" "8 dp=2,ep=2,tp=2 1")"
done

# ---- 3: resume a tp=2 x dp=2 checkpoint on one rank ----
if run 4 "$W/part" $DENSE --steps 10 --mesh dp=2,tp=2 --zero 1 && run 1 "$W/cont" $DENSE --steps 20 --resume "$W/part" &&
   close "$W/DENSE_ref" "$W/cont" 1e-6 10; then
    ok "a dp=2 x tp=2 checkpoint resumes on one rank with the uninterrupted losses"
else bad "dp=2 x tp=2 -> one rank resume"; tail -3 "$W/cont.log"; fi

# ---- 3b: precision=bf16 (the modules' blocks on bf16 shadows like the main blocks; eh_proj and the
# modules' logits in fp32): every series within 1% of the fp32 run, and falling ----
if run 1 "$W/bf16" $DENSE --steps 20 --set precision=bf16 && python3 - "$W/DENSE_ref" "$W/bf16" <<'PY'
import json, sys
a, b = (json.load(open(f + "/receipt.json")) for f in sys.argv[1:])
for k in ("lm_losses", "mtp_1_losses", "mtp_2_losses"):
    d = max(abs(x - y) / abs(x) for x, y in zip(a[k], b[k]))
    print("   %s: bf16 vs fp32 max rel %.2e" % (k, d))
    assert d < 1e-2 and b[k][-1] < b[k][0], k
PY
then ok "precision=bf16: the mtp series track fp32 within 1%"
else bad "precision=bf16 with MTP"; tail -3 "$W/bf16.log"; fi

# recompute=block: the main blocks re-run their forward, the modules keep their own activations: bit-identical
if run 1 "$W/recompute" $DENSE --steps 20 --set recompute=block && close "$W/DENSE_ref" "$W/recompute" 0 &&
   python3 -c "import json,sys; a,b=(json.load(open(f+'/receipt.json')) for f in sys.argv[1:]); \
assert a['mtp_1_losses']==b['mtp_1_losses'] and a['mtp_2_losses']==b['mtp_2_losses']" "$W/DENSE_ref" "$W/recompute"; then
    ok "recompute=block: bit-identical to recompute=none, series and parameters"
else bad "recompute=block with MTP"; fi

# ---- 4: bad input ----
viol 1 dp=1 'mtp_block=E has routed experts' $MOE --set mtp_block=E
viol 1 dp=1 'mtp_block must be one pattern letter' $DENSE --set mtp_block=X
viol 1 dp=1 'mtp_depth' $DENSE --set mtp_depth=5
viol 1 dp=1 'needs seq_len > mtp_depth' $DENSE --set seq_len=2 --set mtp_depth=2
# LoRA: the modules' gains and eh_proj are frozen base tensors; their blocks' adapters train
if run 1 "$W/lora_ref" $DENSE --set lora_rank=2 --steps 20 && differs "$W/lora_ref" "$W/DENSE_ref"; then
    for row in "2 tp=2 0" "2 pp=2 0 --set microbatches=2" "4 dp=2,tp=2 1"; do
        set -- $row; np=$1 mesh=$2 zero=$3; shift 3
        o="$W/lora_${mesh//[=,]/_}_z$zero"
        if run "$np" "$o" $DENSE --set lora_rank=2 --steps 20 --mesh "$mesh" --zero "$zero" "$@" &&
           close "$W/lora_ref" "$o" 1e-6 && mtp_same "$W/lora_ref" "$o"; then
            ok "LoRA with mtp_depth=2 --mesh $mesh zero=$zero $* equals the single-rank losses"
        else bad "LoRA with mtp_depth=2 --mesh $mesh zero=$zero $*"; tail -3 "$o.log"; fi
    done
else bad "LoRA with mtp_depth=2: one-rank reference"; tail -3 "$W/lora_ref.log"; fi
finish
