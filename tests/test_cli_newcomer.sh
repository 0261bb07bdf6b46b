#!/usr/bin/env bash
# test_cli_newcomer.sh BUILD_DIR — issue 32 (a newcomer's first hour): each
# bad input gets one line on stderr, exit 2, and loses nothing.
#  1. `train --out DIR` on a folder holding another run (receipt.json or
#     ckpt/) without --resume is refused, naming --resume and --overwrite;
#     every file there is unchanged. --resume DIR continues it; --overwrite
#     (alias --force) starts a new run there (latest, receipt.json its own).
#  2. vocab_size in the config larger / smaller than the data dir's
#     meta.json (the tokenizer's): refused at train start, one line naming
#     both numbers; with --init-from a smaller data vocabulary is fine.
#  3. `export --out a/b/c` creates the parents, as `train --out` does.
#  5. ranks x threads above the cores: one warning line (none at 1 thread).
#  6. MFU is a percentage in step lines and the done line; the peak and its
#     source are said once at startup.
#  8. `train --data nosuch` names the path, not "vocab_size is not set";
#     a data dir without meta.json says so; `plan --data DIR` reads the
#     vocabulary of a prepared dir.
set -u
BUILD=${1:?usage: test_cli_newcomer.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

D="$W/data"; mkdir -p "$D"
python3 "$HERE/make_shard.py" "$D/train_000.bin" 20000 64 pattern
python3 "$HERE/make_shard.py" "$D/val_000.bin" 2000 64 pattern
echo '{"vocab_size": 64}' >"$D/meta.json"
TINY0=(--set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4
      --set lr=0.01 --set warmup_steps=2 --set eval_every=0 --peak-flops 1e11)
TINY=("${TINY0[@]}" --quiet)
tree_sum() { (cd "$1" && find . -type f -o -type l | sort | xargs -d '\n' sha256sum) 2>/dev/null | sha256sum; }

# expect2 NAME REGEX DIR CMD...: exit 2, one stderr line matching REGEX, DIR's files unchanged
expect2() {
    local name=$1 re=$2 dir=$3; shift 3
    local before; before=$(tree_sum "$dir")
    "$@" >"$W/stdout" 2>"$W/stderr"
    local rc=$? nl; nl=$(wc -l <"$W/stderr")
    if [ $rc -eq 2 ] && [ "$nl" -eq 1 ] && grep -Eq -e "$re" "$W/stderr" && [ "$before" = "$(tree_sum "$dir")" ]; then
        ok "$name"
    else bad "$name (rc=$rc, $nl lines)"; cat "$W/stderr"; fi
}

# ---- 1. no silent overwrite ----
R="$W/runs/a"
if "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 6 --set save_every=3 2>"$W/err" \
   && [ -f "$R/receipt.json" ] && [ -d "$R/ckpt/step_000006" ]; then ok "train into a new --out (parents created)"
else bad "train into a new --out"; cat "$W/err"; fi
expect2 "train into a folder holding a run, no --resume: refused, nothing touched" \
    "^meshtrain train: --out .*runs/a already holds a run.*--resume .*--overwrite" "$R" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 2
expect2 "the same with --steps 0 (the initial checkpoint only)" "already holds a run" "$R" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 0
mkdir -p "$W/runs/b"; cp "$R/receipt.json" "$W/runs/b/"
expect2 "a folder with only a receipt (a --no-save run) is a run too" "already holds a run \(receipt.json\)" "$W/runs/b" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/b" --steps 2 --no-save
expect2 "--init-from a run into the folder of that run: a new run, refused" "already holds a run" "$R" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 2 --init-from "$R"
"$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/c" --steps 2 2>/dev/null
expect2 "--resume of another run into a folder holding a run: refused" "already holds a run" "$R" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 8 --resume "$W/runs/c"
if "$MT" train --data "$D" --out "$R" --steps 8 --resume "$R" --quiet --peak-flops 1e11 2>"$W/err" \
   && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r['losses'])==2, r['losses']" "$R/receipt.json"; then
    ok "--resume DIR continues the run in DIR"
else bad "--resume DIR continues the run in DIR"; cat "$W/err"; fi
for flag in --overwrite --force; do
    # a new run in the folder: latest and the receipt are its; the old run's checkpoints stay (another run id)
    if "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 2 $flag 2>"$W/err" \
       && [ -d "$R/ckpt/step_000002" ] && [ -d "$R/ckpt/step_000006" ] && grep -q '^step_000002$' "$R/ckpt/latest" \
       && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r['losses'])==2" "$R/receipt.json"; then
        ok "$flag starts a new run in the folder (old checkpoints kept)"
    else bad "$flag starts a new run in the folder"; cat "$W/err"; ls "$R/ckpt"; fi
done
expect2 "--overwrite with bad input: refused before anything is removed" "vocab_size 128" "$R" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$R" --steps 2 --overwrite --set vocab_size=128

# ---- 2. vocab_size against the data's vocabulary ----
expect2 "config vocab_size larger than the data's: refused" \
    "^meshtrain train: vocab_size 128 \(config\) is larger than the data's vocabulary 64 \(.*meta\.json" "$W/runs" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/v" --steps 2 --set vocab_size=128
expect2 "config vocab_size smaller than the data's: refused" \
    "^meshtrain train: vocab_size 32 \(config\) is smaller than the data's vocabulary 64" "$W/runs" \
    "$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/v" --steps 2 --set vocab_size=32
[ ! -e "$W/runs/v" ] && ok "the refused runs created no --out" || bad "a refused run created its --out"
mkdir -p "$W/d32"; python3 "$HERE/make_shard.py" "$W/d32/train_000.bin" 20000 32 pattern; echo '{"vocab_size": 32}' >"$W/d32/meta.json"
if "$MT" train "${TINY[@]}" --data "$W/d32" --out "$W/runs/ft" --steps 2 --init-from "$R" 2>"$W/err"; then
    ok "--init-from a 64-token model on 32-token data runs"
else bad "--init-from a 64-token model on 32-token data"; cat "$W/err"; fi
expect2 "--resume a 64-token model on 128-token data: refused" "vocab_size 64 \(the checkpoint's\) is smaller than the data's vocabulary 128" "$R" \
    bash -c "mkdir -p '$W/d128' && cp '$D'/*.bin '$W/d128/' && echo '{\"vocab_size\": 128}' >'$W/d128/meta.json' && exec '$MT' train --data '$W/d128' --out '$R' --steps 6 --resume '$R' --quiet"

# ---- 8. messages about --data ----
expect2 "train --data nosuch names the path" "^meshtrain train: --data .*nosuch: no such file, directory or glob match$" "$W/runs" \
    "$MT" train --data "$W/nosuch" --out "$W/runs/x" --quiet
mkdir -p "$W/bare"; cp "$D/train_000.bin" "$W/bare/"
expect2 "train on a dir without meta.json says so" "vocab_size is not set and .*bare has no meta.json.*--set vocab_size=N" "$W/runs" \
    "$MT" train --data "$W/bare" --out "$W/runs/x" --quiet
if "$MT" plan --data "$D" --world 1 >"$W/out.txt" 2>"$W/err" && grep -q "V=64" "$W/out.txt"; then
    ok "plan --data of a prepared dir reads its vocabulary"
else bad "plan --data of a prepared dir"; cat "$W/err"; fi

# ---- 3. export creates --out's parents ----
if "$MT" export --ckpt "$R" --out "$W/hf/deep/qs" 2>"$W/err" && [ -f "$W/hf/deep/qs/config.json" ]; then
    ok "export --out a/b/c creates the parents"
else bad "export --out a/b/c creates the parents"; cat "$W/err"; fi
# ---- 6. MFU one way: a percentage in step lines and the done line, the peak and its source said ----
if "$MT" train "${TINY0[@]}" --data "$D" --out "$W/runs/mfu" --steps 3 >"$W/mfu.out" 2>"$W/err" \
   && grep -Eq '^step 3/3 loss [0-9.]+ gnorm [0-9.]+ tok/s [0-9]+ mfu [0-9]+\.[0-9]{2}% eta_s' "$W/mfu.out" \
   && grep -Eq '^done: 3 steps, .* MFU [0-9.]+% \(of the peak above\)' "$W/mfu.out" \
   && grep -q '^progress: .* MFU = model FLOP/s as a % of a peak of 100.0 GFLOP/s, given by --peak-flops$' "$W/mfu.out"; then
    ok "MFU: a percentage in step and done lines, the peak and its source named"
else bad "MFU convention"; grep -E "^(step|done|progress)" "$W/mfu.out"; cat "$W/err"; fi

# ---- 5. ranks x threads above the cores: one warning line ----
over=$(( $(getconf _NPROCESSORS_ONLN) + 1 ))
"$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/thr" --steps 1 --set threads=$over >/dev/null 2>"$W/err"
if grep -q "^meshtrain train: warning: 1 rank on this node x $over threads = $over > $(getconf _NPROCESSORS_ONLN) cores: set OMP_NUM_THREADS=" "$W/err"; then
    ok "threads above the cores: warned"
else bad "threads above the cores: no warning"; cat "$W/err"; fi
"$MT" train "${TINY[@]}" --data "$D" --out "$W/runs/thr1" --steps 1 --set threads=1 >/dev/null 2>"$W/err"
[ ! -s "$W/err" ] && ok "one thread: no warning" || { bad "one thread: stderr not empty"; cat "$W/err"; }
finish
