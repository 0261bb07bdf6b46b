#!/usr/bin/env bash
# test_dist_hangs.sh BUILD_DIR — no hang when one rank fails or stalls
# (issue 13 item 8), np=2 on the tiny dense config of test_dist_train.sh:
#  1. setup agreement: one rank alone fails its input checks before the first
#     collective — its --data missing, its --config file missing (refused by
#     the CLI), its --resume missing, its checkpoint
#     unreadable (after the mesh exists), an allocation failing (MT_FAULT
#     RANK:0:oom) — and the job ends within 10 s with the right exit code (2
#     bad input, 1 runtime), the failing rank's message, the other rank's line
#     naming it, and no --out written;
#  2. collective watchdog: one rank stopped (SIGSTOP: MT_FAULT RANK:STEP:stop,
#     and an external kill -STOP) ends the job within comm_timeout_s + a few s,
#     exit 1, with a message naming the waiting rank, the collective and the
#     step; comm_timeout_s=0 is accepted (off) and a negative one refused;
#  3. NaN injection (MT_FAULT RANK:STEP:nan) is caught with tp=2 and on
#     pipeline stage 0: exit 1 naming rank, parameter and step.
# A rank's path differs from the others' through a wrapper that rewrites its
# arguments when OMPI_COMM_WORLD_RANK is the chosen rank.
set -u
BUILD=${1:?usage: test_dist_hangs.sh BUILD_DIR}
MPIRUN_TIMEOUT=${MPIRUN_TIMEOUT:-60}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

# $W/wrap.sh RANK FROM TO CMD... (dist_lib.sh): one rank's argument rewritten
make_rank_wrapper

# ends NAME MAX_S WANT_RC OUT REGEX... : the last job took <= MAX_S, exited WANT_RC,
# its output matches every REGEX, and OUT was not created (OUT "-": not checked)
ends() {
    local name=$1 max=$2 want=$3 out=$4; shift 4
    local miss=""
    for re in "$@"; do grep -Eq -e "$re" "$W/job.log" || miss="$miss [$re]"; done
    if [ "$rc" -eq "$want" ] && [ "$dt" -le "$max" ] && [ -z "$miss" ] && { [ "$out" = - ] || [ ! -e "$out" ]; }; then
        ok "$name (rc=$rc, ${dt}s)"
    else bad "$name (rc=$rc want $want, ${dt}s max $max, missing:$miss)"; cat "$W/job.log"; fi
}
# job ENV... -- ARGS... : np=2 training through the wrapper; sets rc, dt
job() {
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done; shift
    local t0=$SECONDS
    env "${env[@]}" "${MPIRUN[@]}" -x MT_FAULT -np 2 "$@" >"$W/job.log" 2>&1 </dev/null
    rc=$? dt=$((SECONDS - t0))
}

# ---- 1: setup agreement ----
"$MT" train $DENSE $COMMON --out "$W/base" --steps 2 >"$W/base.log" 2>&1 || { bad "base run"; cat "$W/base.log"; }

job MT_FAULT= -- "$W/wrap.sh" 1 "$W/train.bin" "$W/missing.bin" "$MT" train $DENSE $COMMON --out "$W/o1" --steps 4
ends "--data missing on rank 1 only: exit 2 within 10 s" 10 2 "$W/o1" \
    'missing\.bin' 'rank 1 failed during setup'

# a --config file missing on rank 1 only: refused by the CLI, before the trainer
echo '{"seed": 7}' >"$W/cfg.json"
job MT_FAULT= -- "$W/wrap.sh" 1 "$W/cfg.json" "$W/nocfg.json" "$MT" train --config "$W/cfg.json" $DENSE $COMMON --out "$W/o0" --steps 4
ends "--config missing on rank 1 only: exit 2 within 10 s" 10 2 "$W/o0" \
    'nocfg\.json' 'rank 1 failed during setup'

job MT_FAULT= -- "$W/wrap.sh" 1 "$W/base" "$W/nockpt" "$MT" train $DENSE $COMMON --out "$W/o2" --steps 4 --resume "$W/base"
ends "--resume missing on rank 1 only: exit 2 within 10 s" 10 2 "$W/o2" \
    'nockpt' 'rank 1 failed during setup'

# a checkpoint whose manifest reads but whose params.bin is cut short: found
# after the mesh exists (the load), so the second agreement catches it
cp -r "$W/base" "$W/cut"
c=$(ls -d "$W"/cut/ckpt/step_* | tail -1)
head -c 100 "$c/params.bin" >"$c/p" && mv "$c/p" "$c/params.bin"
job MT_FAULT= -- "$W/wrap.sh" 1 "$W/base" "$W/cut" "$MT" train $DENSE $COMMON --out "$W/o3" --steps 4 --resume "$W/base"
ends "a checkpoint unreadable on rank 1 only: exit 2 within 10 s" 10 2 "$W/o3" \
    'params\.bin' 'rank 1 failed during setup'

job MT_FAULT=1:0:oom -- "$MT" train $DENSE $COMMON --out "$W/o4" --steps 4
ends "an allocation failing on rank 1 only: exit 1 within 10 s" 10 1 "$W/o4" \
    'out of memory.*injected' 'rank 1 failed during setup'

# ---- 2: the collective watchdog ----
job MT_FAULT=1:5:stop -- "$MT" train $DENSE $COMMON --out "$W/o5" --steps 400 --zero 2 --set comm_timeout_s=3
ends "rank 1 stopped at step 5: watchdog ends the job (comm_timeout_s=3)" 15 1 - \
    'rank 0: collective [a-z_]+ .*at step 5 has not completed after 3 s'

# an external SIGSTOP mid-run: rank 1 is stopped from outside 1 s after the
# training loop began (--out exists: every rank creates it after setup)
cat >"$W/stopper.sh" <<'SH'
#!/usr/bin/env bash
out=$1; shift
[ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && ( while [ ! -d "$out" ]; do sleep 0.2; done; sleep 1; kill -STOP $$ ) &
exec "$@"
SH
chmod +x "$W/stopper.sh"
job MT_FAULT= -- "$W/stopper.sh" "$W/o6" "$MT" train $DENSE $COMMON --out "$W/o6" --steps 100000 --set comm_timeout_s=2
ends "kill -STOP of rank 1 mid-run: watchdog ends the job (comm_timeout_s=2)" 16 1 - \
    'rank 0: collective [a-z_]+ on a group of 2 ranks at step [0-9]+ has not completed after 2 s' 'comm_timeout_s'

job MT_FAULT= -- "$MT" train $DENSE $COMMON --out "$W/o7" --steps 3 --set comm_timeout_s=0
ends "comm_timeout_s=0 (watchdog off) trains" 30 0 - 'mesh rank=1'
"$MT" train $DENSE $COMMON --out "$W/o8" --steps 1 --set comm_timeout_s=-1 >"$W/job.log" 2>&1
rc=$? dt=0
ends "comm_timeout_s=-1 is refused" 5 2 "$W/o8" "comm_timeout_s"

# ---- 3: NaN injection reaches tp > 1 and pipeline stage 0 ----
job MT_FAULT=1:3:nan -- "$MT" train $DENSE $COMMON --out "$W/n1" --steps 6 --mesh tp=2
ends "MT_FAULT nan with tp=2 (rank 1): exit 1 naming rank, parameter, step" 30 1 - \
    'non-finite gradient on rank 1 in parameter [a-z0-9_.]+ at step 3'
job MT_FAULT=0:3:nan -- "$MT" train $DENSE $COMMON --out "$W/n1" --steps 6 --mesh tp=2 --zero 2
ends "MT_FAULT nan with tp=2, ZeRO-2 (rank 0): exit 1 naming rank, parameter, step" 30 1 - \
    'non-finite gradient on rank 0 in parameter [a-z0-9_.]+ at step 3'
job MT_FAULT=0:3:nan -- "$MT" train $DENSE --set microbatches=2 $COMMON --out "$W/n2" --steps 6 --mesh pp=2
ends "MT_FAULT nan on pipeline stage 0 (rank 0): exit 1 naming rank, parameter, step" 30 1 - \
    'non-finite gradient on rank 0 in parameter model\.layers\.0\.[a-z0-9_.]+ at step 3'
job MT_FAULT=1:3:nan -- "$MT" train $DENSE --set microbatches=2 $COMMON --out "$W/n3" --steps 6 --mesh pp=2
ends "MT_FAULT nan on pipeline stage 1 (rank 1): exit 1 naming rank, parameter, step" 30 1 - \
    'non-finite gradient on rank 1 in parameter [a-z0-9_.]+ at step 3'

# one rank (a group of one reduces nothing: no marking pass before it; the norm finds the
# NaN and the scan of this rank's gradients names it, as the marks did)
t0=$SECONDS
MT_FAULT=0:3:nan "$MT" train $DENSE $COMMON --out "$W/n4" --steps 6 >"$W/job.log" 2>&1
rc=$? dt=$((SECONDS - t0))
ends "MT_FAULT nan on one rank: exit 1 naming rank, parameter, step" 30 1 - \
    'non-finite gradient on rank 0 in parameter model\.norm\.weight at step 3'

finish
