#!/usr/bin/env bash
# test_lora_ckpt.sh BUILD_DIR — adapter-only LoRA checkpoints (issue 16 items
# 4 and 6; docs/checkpoint.md "Adapter-only LoRA checkpoints", docs/lora.md).
# A tiny dense base trains 4 steps; a LoRA run from it (--init-from, every
# target, save_every=3) is the reference.
#  1. writing: every checkpoint of the LoRA run is format version 3, names
#     the base (its manifest_xxh64 and absolute path) and holds the adapters
#     and their AdamW state only; an r=2 q,v checkpoint is > 20x smaller than
#     the base's params.bin;
#  2. resume on the same mesh is bit-exact (every series, params.bin and
#     optim.bin of step 12 against the uninterrupted run); a base that moved:
#     the recorded path is gone -> exit 2, nothing written; --init-from the
#     moved base (same manifest hash) resumes bit-exact and the new
#     checkpoints record the new path;
#  3. resharding on load like full checkpoints: 1 rank -> tp=2 and dp=2 x
#     ZeRO-3 at step 6 (tests/equiv.py bounds), each mesh -> itself at step 9
#     bit-exact (series, params.bin, optim.bin), tp=2 -> 1 rank at step 9;
#     pp=2 x ZeRO-1 likewise; MoE with expert adapters 1 rank -> ep=2;
#  4. refusals (one line, exit 2, nothing written, on every rank): a base
#     with another manifest hash; LoRA rank, alpha or targets changed on
#     resume; --init-from with --resume of a full checkpoint; a LoRA run
#     into the --out that holds its base;
#  5. export --merge of an adapter-only checkpoint: the numpy reference
#     forward of the merged folder equals `meshtrain logits` of the
#     checkpoint (which loads its base), untargeted tensors are the base's
#     bytes; --adapter: PEFT names, the adapters byte for byte; --merge with
#     the base gone: exit 2, nothing written;
#  6. --init-from an adapter-only checkpoint + LoRA: new adapters on the same
#     base (step-0 loss = the base's), the new checkpoints name the base, not
#     the adapter checkpoint;
#  7. a Hugging Face base folder: the checkpoints name the folder and the
#     manifest hash of its import; resume (1 rank bit-exact, tp=2), logits
#     and export --merge re-import and check it; another folder and a
#     missing one are refused; a moved folder is named with --init-from.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_lora_ckpt.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=30"
LORA="--lora 4:8:q,k,v,o,gate,up,down --set total_steps=12 --set save_every=3"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

run 1 "$W/base" $DENSE --steps 4 || { bad "base run"; cat "$W/base.log"; finish; exit 1; }
BASE="$W/base/ckpt/step_000004"
run 1 "$W/ref" $DENSE $LORA --steps 12 --init-from "$W/base" || { bad "LoRA reference"; cat "$W/ref.log"; finish; exit 1; }

# adapter_only RUN BASE_DIR [N [HASH_DIR]] : every checkpoint of RUN is
# adapter-only, names BASE_DIR (with the manifest hash of HASH_DIR, default
# BASE_DIR) and holds N adapters (default 28: 2 layers x 7 targets x (A, B))
adapter_only() {
    python3 - "$1" "$2" "${3:-28}" "${4:-$2}" <<'PY'
import json, os, sys
run, base, want = sys.argv[1], os.path.realpath(sys.argv[2]), int(sys.argv[3])
mb = json.load(open(sys.argv[4] + "/manifest.json"))
cks = sorted(d for d in os.listdir(run + "/ckpt") if d.startswith("step_"))
for d in cks:
    m = json.load(open("%s/ckpt/%s/manifest.json" % (run, d)))
    p = [t["name"] for t in m["tensors"] if t["file"] == "params.bin"]
    o = [t["name"] for t in m["tensors"] if t["file"] == "optim.bin"]
    assert m["version"] == 3 and m["base"] == {"manifest_hash": mb["manifest_xxh64"], "path": base}, (d, m.get("base"))
    assert len(p) == want and all(".lora_" in n for n in p), (d, len(p))
    assert sorted(o) == sorted(n + s for n in p for s in (".exp_avg", ".exp_avg_sq")), (d, len(o))
print("   %d checkpoints: version 3, base %s (%s), %d adapters + their AdamW states" % (len(cks), mb["manifest_xxh64"], base, want))
assert len(cks) >= 1
PY
}

# ---- 1: writing ----
if adapter_only "$W/ref" "$BASE"; then ok "LoRA from a base: adapter-only checkpoints naming the base by manifest hash and path"
else bad "adapter-only checkpoints"; fi
run 1 "$W/small" $DENSE --lora 2:4:q,v --steps 2 --init-from "$W/base" || bad "small LoRA run"
if python3 - "$W/small/ckpt/step_000002" "$BASE" <<'PY'
import os, sys
a, b = sys.argv[1:]
pa, oa, pb = (os.path.getsize(p) for p in (a + "/params.bin", a + "/optim.bin", b + "/params.bin"))
print("   r=2 q,v: params.bin %d + optim.bin %d bytes; the base's params.bin %d bytes" % (pa, oa, pb))
assert 0 < pa * 20 < pb and (pa + oa) * 10 < pb
PY
then ok "adapter checkpoint (r=2, q,v) > 20x smaller than the base's params.bin"
else bad "adapter checkpoint size"; fi

# ---- 2: resume on the same mesh, a moved base ----
if run 1 "$W/r1" $DENSE $LORA --steps 12 --resume "$W/ref/ckpt/step_000006" && close "$W/ref" "$W/r1" 0 6 \
   && cmp "$W/ref/ckpt/step_000012/params.bin" "$W/r1/ckpt/step_000012/params.bin" \
   && cmp "$W/ref/ckpt/step_000012/optim.bin" "$W/r1/ckpt/step_000012/optim.bin" && adapter_only "$W/r1" "$BASE"; then
    ok "resume of an adapter-only checkpoint (base from the recorded path) at step 6: series, params.bin, optim.bin bit-exact"
else bad "adapter-only resume bit-exact"; tail -3 "$W/r1.log"; fi
cp -r "$BASE" "$W/basecopy"
run 1 "$W/mv" $DENSE $LORA --steps 3 --init-from "$W/basecopy" || bad "LoRA run from a copy of the base"
mv "$W/basecopy" "$W/basemoved"
# refuse NP OUT REGEX ARGS... : train on NP ranks exits 2, REGEX on every rank's stderr (one line each), OUT not created
refuse() {
    local np=$1 o=$2 expect=$3; shift 3
    rm -rf "$o"
    if [ "$np" = 1 ]; then "$MT" train "$@" $COMMON --out "$o" >/dev/null 2>"$o.err"
    else "${MPIRUN[@]}" -np "$np" "$MT" train "$@" $COMMON --out "$o" >/dev/null 2>"$o.err" </dev/null; fi
    local rc=$? nl all
    nl=$(grep -cE -e "$expect" "$o.err"); all=$(grep -c "^meshtrain " "$o.err")   # mpirun adds its own lines
    if [ $rc -eq 2 ] && [ "$nl" -eq "$np" ] && [ "$all" -eq "$np" ] && [ ! -e "$o" ]; then ok "refused: $expect ($np rank(s), exit 2, nothing written)"
    else bad "refusal $expect (rc=$rc, $nl of $all lines)"; cat "$o.err"; fi
}
refuse 1 "$W/mv_gone" "its base checkpoint .*basecopy is missing" $DENSE $LORA --steps 12 --resume "$W/mv/ckpt/step_000003"
if run 1 "$W/mv_res" $DENSE $LORA --steps 12 --resume "$W/mv/ckpt/step_000003" --init-from "$W/basemoved" \
   && close "$W/ref" "$W/mv_res" 0 3 && cmp "$W/ref/ckpt/step_000012/optim.bin" "$W/mv_res/ckpt/step_000012/optim.bin" \
   && adapter_only "$W/mv_res" "$W/basemoved"; then
    ok "moved base: --resume + --init-from MOVED (same manifest hash) bit-exact, new checkpoints record the new path"
else bad "moved base resume"; tail -3 "$W/mv_res.log"; fi

# ---- 3: resharding on load ----
while read -r np mesh zero back; do
    x="$W/x_${mesh//[=,]/_}"
    if run "$np" "$x" $DENSE $LORA --steps 12 --mesh "$mesh" --zero "$zero" --resume "$W/ref/ckpt/step_000006" \
       && close "$W/ref" "$x" 1e-6 6 && adapter_only "$x" "$BASE"; then
        ok "1 rank -> $mesh ZeRO-$zero at step 6 continues like the uninterrupted run (adapter-only checkpoints)"
    else bad "1 rank -> $mesh ZeRO-$zero at step 6"; tail -3 "$x.log"; continue; fi
    if run "$np" "$x.same" $DENSE $LORA --steps 12 --mesh "$mesh" --zero "$zero" --resume "$x/ckpt/step_000009" \
       && close "$x" "$x.same" 0 3 && cmp "$x/ckpt/step_000012/params.bin" "$x.same/ckpt/step_000012/params.bin" \
       && cmp "$x/ckpt/step_000012/optim.bin" "$x.same/ckpt/step_000012/optim.bin"; then
        ok "$mesh ZeRO-$zero -> same mesh at step 9: series, params.bin, optim.bin bit-exact"
    else bad "$mesh ZeRO-$zero -> same mesh at step 9"; tail -3 "$x.same.log"; fi
    [ "$back" = 1 ] || continue
    if run 1 "$x.back" $DENSE $LORA --steps 12 --resume "$x/ckpt/step_000009" && close "$W/ref" "$x.back" 1e-6 9; then
        ok "$mesh ZeRO-$zero -> 1 rank at step 9 continues like the uninterrupted run"
    else bad "$mesh ZeRO-$zero -> 1 rank at step 9"; tail -3 "$x.back.log"; fi
done <<'LIST'
2 tp=2 0 1
2 dp=2 3 0
2 pp=2 1 0
LIST

# MoE: the routed experts' frozen weights load from the base by EP subset,
# their adapters from the adapter checkpoint (1 rank -> ep=2 at step 3)
MOE="$DENSE --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2"
MLORA="--lora 4:8:q,v,expert --set total_steps=6 --set save_every=3"
if run 1 "$W/mbase" $MOE --steps 3 && run 1 "$W/mref" $MOE $MLORA --steps 6 --init-from "$W/mbase" \
   && run 2 "$W/mep" $MOE $MLORA --steps 6 --mesh ep=2 --resume "$W/mref/ckpt/step_000003" && close "$W/mref" "$W/mep" 1e-6 3 \
   && adapter_only "$W/mep" "$W/mbase/ckpt/step_000003" 32; then
    ok "MoE (expert adapters): 1 rank -> ep=2 at step 3 continues like the uninterrupted run (adapter-only checkpoints)"
else bad "MoE adapter-only 1 rank -> ep=2"; tail -3 "$W/mep.log"; fi

# ---- 4: refusals ----
run 1 "$W/base2" $DENSE --steps 5 || bad "second base"
refuse 2 "$W/bad_hash" "was trained on the base with manifest hash [0-9a-f]{16}; .* has manifest hash [0-9a-f]{16}: not the same base" \
    $DENSE $LORA --steps 12 --mesh dp=2 --resume "$W/ref/ckpt/step_000006" --init-from "$W/base2"
while read -r l asks; do
    refuse 1 "$W/bad_lora" "cannot resume from .*: it was trained with LoRA rank 4 alpha 8 targets q,k,v,o,gate,up,down, this run asks $asks \(keep --lora as saved\)" \
        $DENSE $LORA --lora "$l" --steps 12 --resume "$W/ref/ckpt/step_000006"
done <<'LIST'
8:8:q,k,v,o,gate,up,down rank 8 alpha 8 targets q,k,v,o,gate,up,down
4:16:q,k,v,o,gate,up,down rank 4 alpha 16 targets q,k,v,o,gate,up,down
4:8:q,v rank 4 alpha 8 targets q,v
LIST
refuse 1 "$W/bad_full" "--resume and --init-from exclude each other .* is a full checkpoint" \
    $DENSE --steps 6 --resume "$W/base" --init-from "$W/base2"
# a LoRA run whose --out holds its base: its own step_N could replace the base
ls -lAR --time-style=full-iso "$W/base" > "$W/base.before"
"$MT" train $DENSE --lora 2:4:q,v --steps 2 --init-from "$W/base" $COMMON --out "$W/base" >/dev/null 2>"$W/inout.err"
rc=$?; ls -lAR --time-style=full-iso "$W/base" > "$W/base.after"
if [ $rc -eq 2 ] && [ "$(grep -c . "$W/inout.err")" -eq 1 ] && grep -q -- "--out .* holds the LoRA base checkpoint" "$W/inout.err" \
   && cmp -s "$W/base.before" "$W/base.after"; then ok "refused: a LoRA run into the --out that holds its base (exit 2, nothing written)"
else bad "LoRA run into its base's --out (rc=$rc)"; cat "$W/inout.err"; diff "$W/base.before" "$W/base.after"; fi

# ---- 5: export ----
PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
IDS=1,5,9,13,2,7,33,60,4,4,17,30
if [ -z "$PY" ]; then skipped_part=1; echo "SKIPPED merged-export logits (no numpy)"
elif "$MT" export --ckpt "$W/ref" --out "$W/merged.hf" --merge >/dev/null 2>"$W/merged.err" \
    && "$MT" logits --ckpt "$W/ref" --ids "$IDS" --out "$W/ref.logits" >/dev/null 2>&1 \
    && $PY "$HERE/hf/ref_forward.py" compare "$W/merged.hf" "$W/ref.logits" "$IDS" --atol 5e-6 \
    && $PY - "$W/merged.hf/model.safetensors" "$BASE" "$HERE" <<'PY'
import sys
sys.path.insert(0, sys.argv[3]); sys.path.insert(0, sys.argv[3] + "/hf")
from equiv import tensors
from ref_forward import load_safetensors
m = load_safetensors(sys.argv[1])
_, b = tensors(sys.argv[2])
same = [n for n in b if m[n].astype("<f4").tobytes() == b[n][1].tobytes()]
moved = sorted(set(b) - set(same))
print("   merged: %d tensors, %d the base's bytes, %d merged (W + s B A)" % (len(m), len(same), len(moved)))
assert set(m) == set(b) and len(moved) == 14 and all(n.endswith("_proj.weight") for n in moved)
PY
then ok "export --merge of an adapter-only checkpoint: reference forward == meshtrain logits (5e-6), untargeted tensors the base's bytes"
else bad "export --merge of an adapter-only checkpoint"; cat "$W/merged.err"; fi
if "$MT" export --ckpt "$W/ref" --out "$W/adapter" --adapter >/dev/null 2>&1 && python3 - "$W/ref" "$W/adapter" "$HERE" <<'PY'
import json, struct, sys
sys.path.insert(0, sys.argv[3])
from equiv import last_ckpt, tensors
_, ck = tensors(last_ckpt(sys.argv[1]))
b = open(sys.argv[2] + "/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
want = {"base_model.model." + k: v for k, v in ck.items()}
assert set(h) == set(want) and len(h) == 28
for k, t in h.items():
    a, z = t["data_offsets"]
    assert tuple(t["shape"]) == want[k][0] and b[8 + n + a:8 + n + z] == want[k][1].tobytes(), k
PY
then ok "export --adapter of an adapter-only checkpoint: PEFT names, the adapters byte for byte"
else bad "export --adapter of an adapter-only checkpoint"; fi
"$MT" export --ckpt "$W/mv/ckpt/step_000003" --out "$W/gone.hf" --merge >/dev/null 2>"$W/gone.err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c . "$W/gone.err")" -eq 1 ] && grep -q "its base checkpoint .*basecopy is missing" "$W/gone.err" \
   && [ ! -e "$W/gone.hf" ]; then ok "export --merge with the base gone: one line, exit 2, nothing written"
else bad "export --merge with the base gone (rc=$rc)"; cat "$W/gone.err"; fi

# ---- 6: --init-from an adapter-only checkpoint ----
if run 1 "$W/chain" $DENSE --lora 2:4:q,v --steps 2 --init-from "$W/ref" && python3 - "$W/ref" "$W/chain" <<'PY'
import json, sys
a, b = (json.load(open(d + "/receipt.json"))["losses"] for d in sys.argv[1:])
print("   step 0: first LoRA run %.17g, LoRA from its adapter checkpoint %.17g" % (a[0], b[0]))
assert a[0] == b[0]
PY
then
    if python3 - "$W/chain/ckpt/step_000002" "$BASE" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1] + "/manifest.json")); mb = json.load(open(sys.argv[2] + "/manifest.json"))
assert m["base"] == {"manifest_hash": mb["manifest_xxh64"], "path": os.path.realpath(sys.argv[2])}, m["base"]
assert len([t for t in m["tensors"] if t["file"] == "params.bin"]) == 8
PY
    then ok "--init-from an adapter-only checkpoint + LoRA: the base's step-0 loss, checkpoints name the base itself"
    else bad "--init-from an adapter-only checkpoint: base reference"; fi
else bad "--init-from an adapter-only checkpoint"; tail -3 "$W/chain.log"; fi

# ---- 7: a Hugging Face base folder ----
# the checkpoints name the folder and the manifest hash of its (deterministic)
# import; resume, logits and export --merge import it again and check the hash
"$MT" export --ckpt "$BASE" --out "$W/hf" >/dev/null 2>&1 && "$MT" import --hf "$W/hf" --out "$W/hf.imp" >/dev/null 2>&1 \
    && "$MT" export --ckpt "$W/base2" --out "$W/hf2" >/dev/null 2>&1 || bad "HF folders of the bases"
HLORA="--lora 4:8:q,k,v,o,gate,up,down --set total_steps=6 --set save_every=3"
if run 1 "$W/href" $DENSE $HLORA --steps 6 --init-from "$W/hf" && adapter_only "$W/href" "$W/hf" 28 "$W/hf.imp"; then
    ok "LoRA from a Hugging Face folder: adapter-only checkpoints naming the folder and its import's manifest hash"
else bad "LoRA from a Hugging Face folder"; tail -3 "$W/href.log"; fi
if run 1 "$W/hres" $DENSE $HLORA --steps 6 --resume "$W/href/ckpt/step_000003" && close "$W/href" "$W/hres" 0 3 \
   && cmp "$W/href/ckpt/step_000006/optim.bin" "$W/hres/ckpt/step_000006/optim.bin" \
   && run 2 "$W/htp" $DENSE $HLORA --steps 6 --mesh tp=2 --resume "$W/href/ckpt/step_000003" && close "$W/href" "$W/htp" 1e-6 3; then
    ok "HF base: resume bit-exact (1 rank), resharded to tp=2 like the uninterrupted run"
else bad "HF base resume"; tail -3 "$W/hres.log" "$W/htp.log"; fi
if [ -n "$PY" ] && "$MT" export --ckpt "$W/href" --out "$W/hmerged" --merge >/dev/null 2>&1 \
   && "$MT" logits --ckpt "$W/href" --ids "$IDS" --out "$W/href.logits" >/dev/null 2>&1 \
   && $PY "$HERE/hf/ref_forward.py" compare "$W/hmerged" "$W/href.logits" "$IDS" --atol 5e-6 >/dev/null; then
    ok "HF base: export --merge reference forward == meshtrain logits (5e-6)"
elif [ -n "$PY" ]; then bad "HF base: export --merge / logits"; fi
refuse 1 "$W/bad_hf" "the Hugging Face folder .*hf2 imports with manifest hash [0-9a-f]{16}: not the same base" \
    $DENSE $HLORA --steps 6 --resume "$W/href/ckpt/step_000003" --init-from "$W/hf2"
mv "$W/hf" "$W/hf.moved"
refuse 1 "$W/hf_gone" "its base checkpoint .*/hf is missing" $DENSE $HLORA --steps 6 --resume "$W/href/ckpt/step_000003"
if run 1 "$W/hmv" $DENSE $HLORA --steps 6 --resume "$W/href/ckpt/step_000003" --init-from "$W/hf.moved" \
   && close "$W/href" "$W/hmv" 0 3 && adapter_only "$W/hmv" "$W/hf.moved" 28 "$W/hf.imp"; then
    ok "HF base moved: --resume + --init-from MOVED_FOLDER bit-exact, new checkpoints name the new folder"
else bad "HF base moved"; tail -3 "$W/hmv.log"; fi

if [ "${skipped_part:-0}" = 1 ] && [ $fails -eq 0 ]; then echo "$passes passed; SKIPPED (part needs numpy)"; exit 77; fi
finish
