#!/usr/bin/env bash
# test_peak_cache.sh BUILD_DIR — the MFU peak measured once per machine and
# kept (issue 32 item 6, src/train/peak_cache.c), in a cache dir of its own
# (XDG_CACHE_HOME=$W/cache):
#   1. the first run measures and writes the cache, saying "kept in";
#   2. the next run reads it: the same peak to the bit, "cached in", no
#      measurement (the roof phase is short), the receipt says so;
#   3. --knob peak_cache=off measures and leaves the file untouched;
#      refresh measures and rewrites it;
#   4. --peak-flops wins over the cache;
#   5. another thread count is another entry;
#   6. a malformed cache is measured over and replaced; an unwritable cache
#      dir is a measurement and "not kept (...)", never a failed run;
#   7. several ranks measure together and neither read nor write the cache;
#   8. a peak below the run's FLOP/s (MFU > 100%) gets a note naming the refresh.
# The one-rank trace line: the seven groups that are the world named once.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
export XDG_CACHE_HOME="$W/cache"
CACHE="$W/cache/meshtrain/peak_flops.json"
python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
ARGS="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set seq_len=16 --set batch_size=4
      --data $W/train.bin --steps 2 --no-save"
run() { local name=$1; shift; $MT train $ARGS --out "$W/$name" "$@" >"$W/$name.out" 2>&1; }
# field NAME KEY: timing.KEY or startup_s.roof of NAME's receipt
field() {
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['timing']
k=sys.argv[2]; print(t['startup_s']['roof'] if k == 'roof' else repr(t[k]))" "$W/$1/receipt.json" "$2"
}

run first && grep -q "measured at startup: .*, kept in $CACHE" "$W/first.out" && [ -f "$CACHE" ] &&
    ok "first run measures and keeps the peak" || bad "first run measures and keeps the peak ($(grep progress "$W/first.out"))"
run second
# a peak below what the run achieves (a cache taken under load): MFU > 100% comes with a note
run lowpeak --peak-flops 1000
grep -q "^note: MFU above 100%.*peak_cache=refresh" "$W/lowpeak.out" && ! grep -q "^note: MFU above" "$W/second.out" &&
    ok "MFU above 100% says the peak is wrong and how to refresh it" || bad "MFU above 100% note ($(tail -2 "$W/lowpeak.out"))"
src=$(field second peak_flops_source)
if echo "$src" | grep -q "cached in $CACHE" && [ "$(field second peak_flops)" = "$(field first peak_flops)" ] &&
   python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 0.5 else 1)" "$(field second roof)"; then
    ok "second run reads the cache (same peak, no measurement)"
else bad "second run reads the cache ($src, roof $(field second roof))"; fi
grep -q "^progress: .*cached in $CACHE.*peak_cache=refresh" "$W/second.out" &&
    ok "the progress line names the cache and how to measure again" || bad "progress line names the cache"
grep -q "moves with the machine's load" "$W/second.out" &&
    bad "a cached peak is not called load-dependent" || ok "a cached peak is not called load-dependent"

before=$(md5sum <"$CACHE")
run off --knob peak_cache=off && grep -q "measured at startup" "$W/off.out" && ! grep -q "kept in" "$W/off.out" &&
    [ "$(md5sum <"$CACHE")" = "$before" ] && ok "peak_cache=off measures and keeps nothing" ||
    bad "peak_cache=off measures and keeps nothing"
run refresh --knob peak_cache=refresh && grep -q "measured at startup: .*, kept in" "$W/refresh.out" &&
    [ "$(md5sum <"$CACHE")" != "$before" ] && ok "peak_cache=refresh measures again and rewrites" ||
    bad "peak_cache=refresh measures again and rewrites"
run given --peak-flops 1e11 && [ "$(field given peak_flops)" = "100000000000" ] && grep -q "given by --peak-flops" "$W/given.out" &&
    ok "--peak-flops wins over the cache" || bad "--peak-flops wins over the cache ($(field given peak_flops))"
OMP_NUM_THREADS=2 run two && grep -q "kept in" "$W/two.out" &&
    python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['entries']; sys.exit(0 if len(e) == 2 and
any('| 1 threads |' in k for k in e) and any('| 2 threads |' in k for k in e) else 1)" "$CACHE" &&
    ok "another thread count is another entry" || bad "another thread count is another entry"

echo '{"format": "meshtrain-peak-cache-1", "entries": {"x": 1}' >"$CACHE"
run garbled && grep -q "measured at startup: .*kept in" "$W/garbled.out" &&
    python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$CACHE" && ok "a malformed cache is measured over and replaced" ||
    bad "a malformed cache is measured over and replaced"
XDG_CACHE_HOME=/proc/meshtrain-nope run unwritable && grep -q "measured at startup: .*not kept (cannot create" "$W/unwritable.out" &&
    ok "an unwritable cache dir costs a note, not the run" || bad "an unwritable cache dir ($(tail -2 "$W/unwritable.out"))"

# the trainer's one-rank trace line (the receipt keeps the full one)
head -1 "$W/second.out" | grep -q '^mesh rank=0 coord(pipe=0,data=0,expert=0,model=0) world{size=1 members=\[0\] impl=self reused=no} model,expert,data,data_expert,data_model,stage,pipe{=world} ep_active=0 .*zero_stage=0$' &&
    [ "$(head -1 "$W/second.out" | wc -c)" -lt 300 ] && ok "one-rank trace line is short" || bad "one-rank trace line ($(head -1 "$W/second.out"))"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['distributed']['trace_rank0']
sys.exit(0 if 'model{size=1 members=[0] impl=self reused=world}' in t else 1)" "$W/second/receipt.json" &&
    ok "the receipt keeps the full trace" || bad "the receipt keeps the full trace"

if command -v mpirun >/dev/null 2>&1; then
    rm -f "$CACHE"
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
        mpirun --allow-run-as-root -np 2 $MT train $ARGS --out "$W/np2" >"$W/np2.out" 2>&1
    grep -q "all ranks at once, x world" "$W/np2.out" && [ ! -f "$CACHE" ] &&
        ok "two ranks measure together, no cache" || bad "two ranks measure together, no cache"
else
    echo "SKIPPED part: no mpirun (the two-rank case)"
fi
finish
