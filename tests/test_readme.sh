#!/usr/bin/env bash
# test_readme.sh BUILD_DIR — issue 32: the README's "next hour" commands run as
# written. Every line of every ```sh block between "## The next hour" and
# "## Reference" is run, in order, with bash, in a scratch directory that
# holds `build` (-> BUILD_DIR), `src` (-> the repo's sources: the text the
# README tokenizes) and `configs/` with the README's config names at a tiny
# size (2 layers, d_model 32: the commands, flags and their order are what is
# checked, not the model). Each must exit 0. mpirun lines run when mpirun is
# there (as root, with Open MPI's OMPI_ALLOW_RUN_AS_ROOT variables, which the
# README names). Then: the README and docs link nothing outside the repo.
set -u
BUILD=${1:?usage: test_readme.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
S="$W/sandbox"; mkdir -p "$S/configs"
ln -s "$BUILD" "$S/build"; ln -s "$ROOT/src" "$S/src"; ln -s "$ROOT/bench" "$S/bench"
TINY='"n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "seq_len": 32, "batch_size": 4, "lr": 0.01, "warmup_steps": 2, "eval_every": 10, "eval_batches": 0'
echo "{$TINY}" >"$S/configs/quickstart.json"
echo "{$TINY, \"pattern\": \"AE\", \"n_experts\": 4, \"top_k\": 2, \"expert_hidden\": 32}" >"$S/configs/quickstart_moe.json"
echo "{$TINY, \"pattern\": \"MA\", \"mamba_d_state\": 8, \"mamba_headdim\": 16}" >"$S/configs/quickstart_hybrid.json"
for f in quickstart quickstart_moe quickstart_hybrid; do
    [ -f "$ROOT/configs/$f.json" ] || bad "README config configs/$f.json is not in the repo"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

mapfile -t CMDS < <(awk '/^## The next hour/{on=1} /^## Reference/{on=0} on && /^```sh/{b=1; next} on && /^```/{b=0} b && NF && !/^#/' "$ROOT/README.md")
[ "${#CMDS[@]}" -ge 10 ] && ok "README: ${#CMDS[@]} commands found" || bad "README: only ${#CMDS[@]} commands found"
for c in "${CMDS[@]}"; do
    if [[ "$c" == *mpirun* ]] && ! command -v mpirun >/dev/null 2>&1; then echo "SKIP (no mpirun): $c"; continue; fi
    if (cd "$S" && timeout 300 bash -c "$c" </dev/null >"$W/out" 2>"$W/err"); then ok "README: $c"
    else bad "README: $c"; tail -5 "$W/err"; fi
done
[ -f "$S/hf/mine/config.json" ] && [ -f "$S/runs/mine/receipt.json" ] && ok "README: the runs and the export are there" \
    || bad "README: outputs missing"

# no link out of the repository, no reference to the shared contract files a clone lacks
if grep -nE '\]\(\.\./|/work/|SPEC\.md|STYLE\.md|SPEC §' "$ROOT/README.md" "$ROOT"/docs/*.md >"$W/links"; then
    bad "README/docs link outside the repo"; cat "$W/links"
else ok "README and docs link nothing outside the repo"; fi
# every relative link in README.md and docs/ resolves
missing=0
while IFS=: read -r file target; do
    t=${target%%#*}; [ -z "$t" ] && continue
    case "$t" in http*|mailto:*) continue ;; esac
    [ -e "$(dirname "$file")/$t" ] || { echo "  $file -> $t"; missing=1; }
done < <(grep -oE '\]\([^)]+\)' "$ROOT/README.md" "$ROOT"/docs/*.md | sed -E 's/\]\(([^)]*)\)$/\1/; s/^([^:]*):/\1:/')
[ $missing -eq 0 ] && ok "every relative link resolves" || bad "broken relative links"
finish
