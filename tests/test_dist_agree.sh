#!/usr/bin/env bash
# test_dist_agree.sh BUILD_DIR — ranks that were given different
# configurations (issue 33 item 1): an MPMD launch (`mpirun -np 1 meshtrain
# ... : -np 1 meshtrain ... --set d_model=64`) or a wrapper that rewrites one
# rank's arguments used to end in MPI_ERR_TRUNCATE and a segfault (d_model,
# pattern), a silently wrong run (seq_len), a hang (--mesh), a committed
# checkpoint (seed, lr) or a failure at the save (--out). Now the setup
# agreement compares a hash of each rank's resolved config, mesh, data, --out
# and build before the mesh is made: every case exits 2 within 10 s on every
# rank, naming the first differing key and the ranks, with nothing written.
set -u
BUILD=${1:?usage: test_dist_agree.sh BUILD_DIR}
MPIRUN_TIMEOUT=${MPIRUN_TIMEOUT:-60}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
python3 "$HERE/make_shard.py" "$W/other.bin" 30000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set seed=1 --set warmup_steps=2 --set total_steps=20"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

# $W/wrap.sh RANK FROM TO CMD... (dist_lib.sh): one rank's argument rewritten
make_rank_wrapper

# differs NAME FROM TO REGEX [EXTRA...] : rank 1 gets TO for FROM; the job
# exits 2 within 10 s, names the key (REGEX) and both ranks, no segfault,
# nothing under either --out
differs() {
    local name=$1 from=$2 to=$3 re=$4; shift 4
    rm -rf "$W/o" "$W/o2"
    local t0=$SECONDS
    "${MPIRUN[@]}" -np 2 "$W/wrap.sh" 1 "$from" "$to" "$MT" train $DENSE $COMMON --out "$W/o" --steps 3 "$@" \
        >"$W/job.log" 2>&1 </dev/null
    local rc=$? dt=$((SECONDS - t0)) n
    n=$(grep -c "ranks disagree on $re: rank 0 and rank 1" "$W/job.log")
    if [ $rc -eq 2 ] && [ $dt -le 10 ] && [ "$n" -ge 2 ] && ! grep -Eqi 'segmentation|TRUNCATE|signal' "$W/job.log" &&
        [ ! -e "$W/o" ] && [ ! -e "$W/o2" ]; then
        ok "$name differs on rank 1: exit 2 in ${dt}s, both ranks name '$re', nothing written"
    else bad "$name differs on rank 1 (rc=$rc want 2, ${dt}s, $n ranks named it)"; cat "$W/job.log"; fi
}

differs "d_model" d_model=32 d_model=64 d_model
differs "pattern" pattern=AA pattern=AE pattern --set pattern=AA --set n_experts=4 --set top_k=2
differs "seq_len" seq_len=16 seq_len=8 seq_len
differs "seed" seed=1 seed=2 seed
differs "lr" lr=0.01 lr=0.02 lr
differs "--out" "$W/o" "$W/o2" --out
differs "--mesh" dp=2 tp=2 --mesh --mesh dp=2
differs "--data" "$W/train.bin" "$W/other.bin" --data
differs "--steps" 3 4 --steps
differs "knob zero_overlap" zero_overlap=1 zero_overlap=0 "knob zero_overlap" --knob zero_overlap=1

# the same --data path naming another file on each node (here: another cwd
# per rank), same size and vocabulary: the data's content hash differs
mkdir -p "$W/n0" "$W/n1"
python3 "$HERE/make_shard.py" "$W/n0/tok.bin" 20000 64 pattern
python3 "$HERE/make_shard.py" "$W/n1/tok.bin" 20000 64 random
cat >"$W/cdwrap.sh" <<SH
#!/usr/bin/env bash
cd "$W/n\${OMPI_COMM_WORLD_RANK:-0}" && exec "\$@"
SH
chmod +x "$W/cdwrap.sh"
rm -rf "$W/o"
"${MPIRUN[@]}" -np 2 "$W/cdwrap.sh" "$(cd "$(dirname "$MT")" && pwd)/meshtrain" train $DENSE --peak-flops 1e11 --quiet --data tok.bin --out "$W/o" --steps 3 \
    >"$W/job.log" 2>&1 </dev/null
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'ranks disagree on the training data: rank 0 and rank 1' "$W/job.log")" -ge 2 ] && [ ! -e "$W/o" ]; then
    ok "same --data path, other content on rank 1: exit 2 naming the training data"
else bad "same --data path, other content (rc=$rc)"; cat "$W/job.log"; fi

# the MPMD form of the issue
rm -rf "$W/o"
"${MPIRUN[@]}" -np 1 "$MT" train $DENSE $COMMON --out "$W/o" --steps 3 : \
    -np 1 "$MT" train $DENSE $COMMON --set d_model=128 --out "$W/o" --steps 3 >"$W/job.log" 2>&1 </dev/null
rc=$?
if [ $rc -eq 2 ] && grep -q "ranks disagree on d_model" "$W/job.log" && [ ! -e "$W/o" ]; then
    ok "MPMD d_model=128 on rank 1: exit 2, nothing written"
else bad "MPMD d_model (rc=$rc)"; cat "$W/job.log"; fi

# the same arguments everywhere still train (threads may differ per node)
rm -rf "$W/o"
"${MPIRUN[@]}" -np 2 "$W/wrap.sh" 1 threads=1 threads=2 "$MT" train $DENSE $COMMON --set threads=1 --out "$W/o" --steps 2 \
    >"$W/job.log" 2>&1 </dev/null
rc=$?
if [ $rc -eq 0 ] && [ -d "$W/o" ]; then ok "same config (threads differ): trains"
else bad "same config (rc=$rc)"; cat "$W/job.log"; fi
finish
