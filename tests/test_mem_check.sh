#!/usr/bin/env bash
# test_mem_check.sh BUILD_DIR — sizes checked before allocation (issue 33
# item 6). Before: `--set d_model=1048576` zero-filled a 15.9 GB activation
# buffer before noticing that the parameters (24 TB) cannot fit. Now the
# plan's bytes of the rank (the planner's size functions, the same the
# runtime allocates with) are compared with the memory there is (host:
# MemAvailable + SwapFree; cuda: the GPU's free memory) at the end of the
# local setup, before the model exists: exit 2 within 5 s, one line with the
# numbers, no large allocation (peak RSS < 300 MB), nothing written. Under
# a virtual-memory limit of 8 GB, so that a planted bug fails cheaply.
set -u
BUILD=${1:?usage: test_mem_check.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set warmup_steps=2"

# too_big NAME ARGS... : exit 2 within 5 s, "the plan needs ... GiB", RSS < 300 MB, no --out
too_big() {
    local name=$1; shift
    rm -rf "$W/o"
    local t0=$SECONDS
    ( ulimit -v 8000000; exec /usr/bin/env time -f "%M" -o "$W/rss" timeout 60 "$MT" train $TINY "$@" \
        --data "$W/train.bin" --out "$W/o" --steps 1 --quiet --peak-flops 1e11 ) >/dev/null 2>"$W/err"
    local rc=$? dt=$((SECONDS - t0)) rss
    rss=$(tail -1 "$W/rss" 2>/dev/null); rss=${rss:-0}
    if [ $rc -eq 2 ] && [ $dt -le 5 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q "the plan needs .* GiB of host memory on rank 0 (params" "$W/err" &&
        [ "$rss" -lt 300000 ] && [ ! -e "$W/o" ]; then ok "$name: exit 2 in ${dt}s, peak RSS ${rss} KB: $(cat "$W/err")"
    else bad "$name (rc=$rc want 2, ${dt}s, RSS ${rss} KB, out $([ -e "$W/o" ] && echo written || echo absent)): $(cat "$W/err")"; fi
}

if ! command -v /usr/bin/time >/dev/null 2>&1 && ! env time --version >/dev/null 2>&1; then echo "SKIPPED (no GNU time)"; exit 77; fi
too_big "d_model=1048576" --set d_model=1048576
too_big "40 layers of d_model=8192 (312 GiB)" --set d_model=8192 --set n_head=64 --set n_kv_head=8 --set n_layer=40
too_big "batch_size=4096 x seq_len=8192 activations" --set batch_size=4096 --set seq_len=8192 --set d_model=1024 --set n_head=8

# a model that fits still trains
rm -rf "$W/o"
"$MT" train $TINY --data "$W/train.bin" --out "$W/o" --steps 1 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err" &&
    ok "the tiny model trains" || bad "tiny model: $(cat "$W/err")"
finish
