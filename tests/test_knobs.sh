#!/usr/bin/env bash
# Knobs and sizes (issue 14 items 4-5), one rank, no MPI:
#   1. every knob of the table is listed by `train --help`;
#   2. the receipt's "knobs" echoes every knob with value and source:
#      default, env alias (MT_ZERO_OVERLAP=0), config file ("knobs" object),
#      command line (--knob) — and the value reaches the library (ZeRO's
#      overlap, distributed.tunables.MT_ZERO_OVERLAP); precedence command
#      line > config > env > default, whatever the order of the flags;
#   3. runtime_mode says fp32 on the cpu backend;
#   4. a bad knob (unknown name, bad bool, bad choice, bad seconds, a whole
#      number out of range), on the command line, in the config's "knobs" or
#      in an environment alias (MT_ZERO_OVERLAP=yes, MT_CUDA_GG_BN=100: also
#      where --knob overrides it), is exit 2, one line, nothing written under
#      --out; a config's whole-number knob reaches the receipt;
#   5. the test hook set by --knob test_fault=0:1:error fails the run at step 1
#      (exit 1, the injected message);
#   6. one size parser: `plan --mem-per-rank 80G` and `prepare --max-bytes 1G`
#      are refused (exit 2) with a message naming both 80GiB and 80GB.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
if [ ! -x "$MT" ]; then echo "FAIL: $MT not built"; exit 1; fi
# every knob of the table (the help and the receipt must list exactly these); no alias set
KNOBS="zero_overlap cuda_precision nccl_timeout_s moe_grouped cuda_graphs peak_cache attn_kernel scan_bf16 moe_sizes
       head_bf16_logits attn_ds_mb attn_group_kib grouped_gemm_bn grouped_gemm_kernel bf16_scratch_mb muon_ns_bf16
       param_init_device
       test_fault
       test_force_routing test_loss_part"
for v in $(compgen -e | grep '^MT_'); do unset "$v"; done
python3 "$HERE/make_shard.py" "$W/train.bin" 4000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --peak-flops 1e11 --quiet --data $W/train.bin --steps 2"

# 1. --help lists the knobs
H=$($MT train --help)
miss=""
for k in $KNOBS; do
  echo "$H" | grep -q "^  $k " || miss="$miss $k"
done
[ -z "$miss" ] && ok "help lists every knob" || bad "help lacks:$miss"

# 2-3. receipts: default, env, command line (beats env)
check() {  # name out zero_overlap_value source
  python3 - "$2/receipt.json" "$3" "$4" $KNOBS <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["knobs"].pop("test_loss_part")["test_hook"] is True, r["knobs"]
k = r["knobs"]
assert set(k) | {"test_loss_part"} == set(sys.argv[4:]), k.keys()
assert k["attn_ds_mb"]["env_alias"] == "MT_CUDA_ATTN_DS_MB" and k["grouped_gemm_bn"]["env_alias"] == "MT_CUDA_GG_BN", k
assert k["moe_sizes"]["value"] == "auto" and k["moe_sizes"]["env_alias"] == "MT_MOE_SIZES", k["moe_sizes"]
assert k["head_bf16_logits"]["value"] == "1" and k["head_bf16_logits"]["env_alias"] == "MT_HEAD_BF16_LOGITS", k["head_bf16_logits"]
assert k["attn_kernel"]["value"] == "v3" and k["attn_kernel"]["env_alias"] == "MT_CUDA_ATTN_KERNEL", k["attn_kernel"]
assert k["zero_overlap"]["value"] == sys.argv[2] and k["zero_overlap"]["source"] == sys.argv[3], k["zero_overlap"]
assert k["zero_overlap"]["env_alias"] == "MT_ZERO_OVERLAP" and k["test_fault"]["test_hook"] is True
assert r["distributed"]["tunables"]["MT_ZERO_OVERLAP"] == int(sys.argv[2]), r["distributed"]["tunables"]
assert r["backend"]["runtime_mode"] == "fp32" and r["backend"]["muon_newton_schulz"] == "fp32", r["backend"]
PY
}
$MT train $TINY --out "$W/d" > /dev/null 2>&1 && check x "$W/d" 1 default && ok "default knob in receipt" || bad "default knob in receipt"
MT_ZERO_OVERLAP=0 $MT train $TINY --out "$W/e" > /dev/null 2>&1 && check x "$W/e" 0 env && ok "env alias in receipt" || bad "env alias in receipt"
MT_ZERO_OVERLAP=1 $MT train $TINY --knob zero_overlap=0 --out "$W/c" > /dev/null 2>&1 && check x "$W/c" 0 "command line" \
  && ok "--knob reaches the library and the receipt" || bad "--knob reaches the library and the receipt"
# the config file's "knobs": reaches the library; beats env; loses to --knob (given before or after --config)
printf '{"knobs": {"zero_overlap": 0, "nccl_timeout_s": 30}}\n' > "$W/k0.json"
MT_ZERO_OVERLAP=1 $MT train $TINY --config "$W/k0.json" --out "$W/g" > /dev/null 2>&1 && check x "$W/g" 0 config \
  && python3 -c "import json,sys; k=json.load(open(sys.argv[1]))['knobs']['nccl_timeout_s']; assert k == {**k, 'value': '30', 'source': 'config'}, k" "$W/g/receipt.json" \
  && ok "config knobs reach the library and the receipt, beating env" || bad "config knobs reach the library and the receipt"
$MT train $TINY --knob zero_overlap=1 --config "$W/k0.json" --out "$W/h" > /dev/null 2>&1 && check x "$W/h" 1 "command line" \
  && ok "--knob beats the config's knobs" || bad "--knob beats the config's knobs"

# 4. bad knobs: exit 2, one line, nothing written
for kv in nope=1 zero_overlap=2 cuda_precision=fp16 zero_overlap nccl_timeout_s=0 nccl_timeout_s=x attn_ds_mb=-1 \
          attn_ds_mb=2k bf16_scratch_mb=0 attn_group_kib=99999999999999999999 grouped_gemm_bn=100 \
          grouped_gemm_kernel=cutlass; do
  $MT train $TINY --knob "$kv" --out "$W/bad" > /dev/null 2> "$W/err"; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -q -- "--knob" "$W/err" && [ ! -e "$W/bad" ]; then
    ok "bad knob $kv refused"
  else
    bad "bad knob $kv: rc=$rc $(cat "$W/err")"
  fi
done

for kj in '"nope": 1' '"zero_overlap": 2' '"cuda_precision": "fp16"' '"nccl_timeout_s": -1' '"zero_overlap": [1]'; do
  printf '{"knobs": {%s}}\n' "$kj" > "$W/kb.json"
  $MT train $TINY --config "$W/kb.json" --out "$W/bad" > /dev/null 2> "$W/err"; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -q "config knobs" "$W/err" && [ ! -e "$W/bad" ]; then
    ok "bad config knob $kj refused"
  else
    bad "bad config knob $kj: rc=$rc $(cat "$W/err")"
  fi
done

# ... and in an environment alias: refused (and named) even where --knob overrides it
while IFS='|' read -r setting knob; do
  env "$setting" $MT train $TINY $knob --out "$W/bad" > /dev/null 2> "$W/err"; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -q "^meshtrain train: env $setting (knob " "$W/err" &&
     [ ! -e "$W/bad" ]; then
    ok "bad env alias $setting refused${knob:+ (with $knob)}"
  else
    bad "bad env alias $setting${knob:+ (with $knob)}: rc=$rc $(cat "$W/err")"
  fi
done <<'ENV'
MT_ZERO_OVERLAP=yes|
MT_PEAK_CACHE=sometimes|
MT_NCCL_TIMEOUT_S=-5|
MT_CUDA_GG_BN=100|--knob grouped_gemm_bn=128
MT_CUDA_ATTN_DS_MB=lots|
MT_CUDA_BF16_SCRATCH_MB=0|
ENV
printf '{"vocab_size": 512, "n_layer": 4}\n' > "$W/c.json"
MT_CUDA_ATTN_GROUP_KIB=-1 $MT plan --config "$W/c.json" --world 1 > /dev/null 2> "$W/err"; rc=$?
[ $rc -eq 2 ] && grep -q "env MT_CUDA_ATTN_GROUP_KIB=-1 (knob attn_group_kib): expected a whole number in \[0, " \
    "$W/err" \
  && ok "plan refuses a bad env alias" || bad "plan with a bad env alias: rc=$rc $(cat "$W/err")"
# a whole-number knob from the config (a JSON number) and the env alias of another, in the receipt
printf '{"knobs": {"attn_ds_mb": 0, "grouped_gemm_bn": 128}}\n' > "$W/k1.json"
MT_CUDA_BF16_SCRATCH_MB=8 $MT train $TINY --config "$W/k1.json" --out "$W/i" > /dev/null 2>&1 &&
  python3 -c "
import json, sys
k = json.load(open(sys.argv[1]))['knobs']
assert (k['attn_ds_mb']['value'], k['attn_ds_mb']['source']) == ('0', 'config'), k['attn_ds_mb']
assert (k['grouped_gemm_bn']['value'], k['grouped_gemm_bn']['source']) == ('128', 'config'), k['grouped_gemm_bn']
assert (k['bf16_scratch_mb']['value'], k['bf16_scratch_mb']['source']) == ('8', 'env'), k['bf16_scratch_mb']
assert (k['attn_group_kib']['value'], k['attn_group_kib']['source']) == ('0', 'default'), k['attn_group_kib']
" "$W/i/receipt.json" && ok "whole-number knobs from the config and env in the receipt" \
  || bad "whole-number knobs from the config and env in the receipt"

# 5. the test hook through --knob
$MT train $TINY --knob test_fault=0:1:error --out "$W/f" > /dev/null 2> "$W/err"; rc=$?
[ $rc -eq 1 ] && grep -q "injected failure (MT_FAULT) on rank 0 at step 1" "$W/err" && ok "test_fault knob" \
  || bad "test_fault knob: rc=$rc $(cat "$W/err")"

# 6. one size parser
printf '{"vocab_size": 512, "n_layer": 4}\n' > "$W/c.json"
$MT plan --config "$W/c.json" --world 1 --mem-per-rank 80G > /dev/null 2> "$W/err"; rc=$?
[ $rc -eq 2 ] && grep -q "80GiB" "$W/err" && grep -q "80GB" "$W/err" && ok "plan refuses 80G" || bad "plan 80G: rc=$rc $(cat "$W/err")"
$MT plan --config "$W/c.json" --world 1 --mem-per-rank 80GiB > /dev/null 2> "$W/err"; rc=$?
[ $rc -eq 0 ] && ok "plan takes 80GiB" || bad "plan 80GiB: rc=$rc $(cat "$W/err")"
$MT prepare --tokenizer "$W/none.bin" --out "$W/p" --max-bytes 1G > /dev/null 2> "$W/err"; rc=$?
[ $rc -eq 2 ] && grep -q "1GiB" "$W/err" && grep -q "1GB" "$W/err" && [ ! -e "$W/p" ] && ok "prepare refuses 1G" \
  || bad "prepare 1G: rc=$rc $(cat "$W/err")"

echo "test_knobs: $passes passed, $fails failed"
[ $fails -eq 0 ]
