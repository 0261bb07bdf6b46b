#!/usr/bin/env python3
"""replica_pairs.py RUN : the number of (tensor, rank pair) comparisons the
replica hash check of run RUN must make, computed from the mesh and the model
alone (RUN/receipt.json for the mesh and the pipeline cut, the tensor names
of RUN's last checkpoint), independently of the trainer's own loop.

Who holds a tensor (mesh rank = ((pipe * dp + data) * ep + expert) * tp + model):
  - its pipeline stage only: embed_tokens on stage 0, model.norm and lm_head on
    the last stage, model.layers.<l>.* on the stage whose layer range has l;
  - an expert e of a layer with E experts: the expert rank e // (E / ep) only;
    everything else: every expert rank (ep is data for dense parameters);
  - every data and model rank; a TP-split tensor (q/k/v/o_proj, the dense MLP's
    gate/up/down_proj) is a different slice per model rank, so only ranks with
    the same model coordinate hold the same copy;
  - an M block's mixer (docs/mamba3.md) splits by heads: the in-projection
    blocks, out_proj, dt_bias, A_log, D, B_bias, C_bias, norm.weight; its B/C
    norm gains are whole, and so are in_proj_B / in_proj_C when
    mamba_ngroups % tp != 0 (replicated B/C, SPEC 1c);
  - LoRA adapters (docs/lora.md): on a column-parallel W (q, k, v, gate, up,
    the mixer's in-projection blocks) lora_B is split and lora_A whole (the
    in-projection's one shared mixer.in_proj.lora_A too); on a row-parallel W
    (o, down, the mixer's out_proj) lora_A is split and lora_B whole; experts'
    adapters live with their expert.
Two ranks holding the same copy form one comparison. One rank: 0.
ZeRO-3 keeps one copy per reduction group, on one owner: only a whole tensor
whose gradient is reduced over data (x expert) alone has several owners, one
per model rank — the residual stream's tensors (embed_tokens, the blocks'
input norms, model.norm, lm_head, the MTP modules' gains and eh_proj, the
Mixture-of-Depths routers) when
tp > 1 and sequence parallelism is off (with SP on they are partial over
model, reduced over the whole stage: one owner); a TP-split tensor's owners hold different slices; every other
tensor is partial over model or an expert: one owner.
Prints the count."""
import json
import os
import re
import sys


def main(run):
    r = json.load(open(os.path.join(run, "receipt.json")))
    m = r["mesh"]
    pp, dp, ep, tp = m["pp"], m["dp"], m["ep"], m["tp"]
    W = pp * dp * ep * tp
    if W == 1:
        return 0
    ck = os.path.join(run, "ckpt", sorted(os.listdir(os.path.join(run, "ckpt")))[-1])
    names = [t["name"] for t in json.load(open(os.path.join(ck, "manifest.json")))["tensors"]
             if t["file"] == "params.bin"]
    cfg = r["config"]
    L, E = cfg["n_layer"], cfg["n_experts"]
    if pp > 1:
        cut = [(s["first_layer"], s["end_layer"]) for s in r["distributed"]["pipeline"]["stage_layers"]]
    else:
        cut = [(0, L)]

    def coord(rank):
        model = rank % tp; rank //= tp
        expert = rank % ep; rank //= ep
        data = rank % dp; rank //= dp
        return rank, data, expert, model

    total = 0
    for n in names:
        lm = re.match(r"model\.layers\.(\d+)\.", n)
        if lm:
            layer = int(lm.group(1))
            stage = next(s for s, (a, b) in enumerate(cut) if a <= layer < b)
        else:
            stage = 0 if n == "model.embed_tokens.weight" else pp - 1
        em = re.search(r"\.mlp\.experts\.(\d+)\.", n)
        erank = int(em.group(1)) // (E // ep) if em else None
        split = tp > 1 and not em and "shared_expert" not in n and re.search(
            r"\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$", n) is not None
        if tp > 1 and not em and "shared_expert" not in n:
            split = split or re.search(r"\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)\.lora_B\.weight$", n) \
                is not None or re.search(r"\.(self_attn\.o_proj|mlp\.down_proj)\.lora_A\.weight$", n) is not None
            split = split or re.search(r"\.mixer\.(in_proj_\w+\.weight|out_proj\.weight|dt_bias|A_log|D|[BC]_bias|"
                                       r"norm\.weight|in_proj_\w+\.lora_B\.weight|out_proj\.lora_A\.weight)$", n) is not None
        # Mamba-3 B/C under TP: whole on every rank when mamba_ngroups % tp != 0 (SPEC 1c)
        if split and re.search(r"\.mixer\.in_proj_[BC]\.weight$", n) and cfg.get("mamba_ngroups", 1) % tp:
            split = False
        holders = [c for c in map(coord, range(W)) if c[0] == stage and (erank is None or c[2] == erank)]
        if r["zero_stage"] == 3:
            residual = re.search(r"(^model\.embed_tokens|input_layernorm|post_attention_layernorm|^model\.norm|"
                                 r"^lm_head|^model\.mtp\.\d+\.(enorm|hnorm|norm|eh_proj)|\.mod)\.weight$", n) is not None
            if not (residual and tp > 1 and not cfg.get("sequence_parallel", True)):
                continue
            holders = [c for c in holders if c[1] == 0 and c[2] == 0]   # one owner per model rank
        for i in range(len(holders)):
            for j in range(i + 1, len(holders)):
                if not split or holders[i][3] == holders[j][3]:
                    total += 1
    return total


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(main(sys.argv[1]))
