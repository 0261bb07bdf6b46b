#!/usr/bin/env python3
"""bench/hf_logits_gpu.py — issue 20 item 5, for bench/gpu.sh stage hf: the
Hugging Face export of a meshtrain checkpoint, loaded by the image's
transformers (AutoModelForCausalLM, float32, eval, eager attention), gives the
logits `meshtrain logits` gives on the GPU (--backend cuda) and on the CPU.

Usage:
  hf_logits_gpu.py --name CFG --ids 3,17,... --cpu CPU.safetensors
                   [--cuda CUDA.safetensors] [--hf EXPORT_DIR] [--json OUT.json]

Inputs are `meshtrain logits` outputs (F32 "logits" (n, V) after softcap,
"lm_loss", "aux_loss", "z_loss") of the same checkpoint and ids. Checks:
  cuda vs cpu (meshtrain against itself): logits and lm/aux/z   <= TOL_BACKEND
  HF vs cuda and HF vs cpu: logits                               <= TOL_HF
  HF's mean next-token CE over the ids vs meshtrain's lm_loss    <= TOL_HF
Logit differences are relative to the largest reference logit magnitude
(max |a - b| / max |b|): an element-wise relative error means nothing for
logits near 0. Loss terms are element-wise relative (a zero term, the dense
aux/z, must be zero on both sides).

Tolerances (fp32 everywhere: meshtrain's cuda fp32 mode is cublasSgemm in IEEE
fp32, no TF32 (docs/cuda.md), and torch is set to the same: TF32 off for
matmul and cuDNN, float32 matmul precision "highest"):
  TOL_BACKEND = 1e-5: the same forward, same operands, different summation
    order and device math (expf/tanhf ulps, FMA): the op harness's per-op
    bound (cuda_ops_vs_cpu, 1e-5) and a 2-layer forward adds a few roundings
    of ~6e-8 each; observed ~1e-7 under the emulator.
  TOL_HF = 1e-4: an independent implementation (HF computes RoPE's cos/sin in
    fp32 from inv_freq, softmax and RMSNorm in its own order, SiLU/sigmoid via
    torch): each of ~10 stages of a tiny model contributes ~1e-7..1e-6
    relative; 1e-4 leaves ~100x margin, while any real mismatch (RoPE layout,
    norm eps, a transposed or mis-named weight, top-k routing, softcap) moves
    logits by 1e-2 or more. The same bound as tests/hf/check_hf.py (CPU).
Runs on the GPU when torch sees one, else on the CPU (same checks).

Prints "RESULT hf CFG: ..." lines (bench/gpu.sh collects them). Exit 0 all
ran and passed; 1 a check failed; 77 the meshtrain checks passed but the HF
part could not run (no torch/transformers: a "SKIPPED (hf CFG: ...)" line).
No numpy needed (the tensors are tiny).
"""
import argparse
import json
import math
import struct
import sys

TOL_BACKEND = 1e-5
TOL_HF = 1e-4


def st_load(path):
    """safetensors -> {name: (shape, flat list of floats)} (F32 only)."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, e in h.items():
        if k == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit("%s: %s is %s, expected F32" % (path, k, e["dtype"]))
        lo, hi = e["data_offsets"]
        out[k] = (e["shape"], list(struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])))
    return out


def logits_rel(got, ref):
    """(max |got - ref|, that over max |ref|) for two flat lists."""
    if len(got) != len(ref) or not ref:
        return float("inf"), float("inf")
    d = max(abs(x - y) for x, y in zip(got, ref))
    scale = max(abs(y) for y in ref)
    return d, (d / scale if scale > 0 else (0.0 if d == 0 else float("inf")))


def term_rel(x, ref):
    if ref == 0:
        return 0.0 if x == 0 else float("inf")
    return abs(x - ref) / abs(ref)


def mean_ce(flat, n, V, ids):
    """Mean next-token cross-entropy over the n-1 targets ids[1:], in float64."""
    tot = 0.0
    for t in range(n - 1):
        row = flat[t * V:(t + 1) * V]
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        tot += lse - row[ids[t + 1]]
    return tot / (n - 1)


def hf_forward(d, ids):
    """Logits (flat list) of the export at d on ids, plus a description; None if torch/transformers are missing."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        return None, "no torch + transformers (%s)" % e
    torch.backends.cuda.matmul.allow_tf32 = False   # meshtrain's fp32 mode is IEEE fp32 (no TF32)
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # eager attention: plain fp32 matmuls + softmax (SDPA's kernels may differ per device and version)
    m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager")
    m = m.to(device=dev, dtype=torch.float32).eval()
    with torch.no_grad():
        lg = m(torch.tensor([ids], device=dev)).logits[0].float().cpu()
    desc = "transformers %s torch %s %s on %s" % (transformers.__version__, torch.__version__, type(m).__name__,
                                                 torch.cuda.get_device_name(0) if dev == "cuda" else "cpu")
    return lg.reshape(-1).tolist(), desc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--cpu", required=True, help="`meshtrain logits --backend cpu` output")
    ap.add_argument("--cuda", help="`meshtrain logits --backend cuda` output")
    ap.add_argument("--hf", help="`meshtrain export` folder")
    ap.add_argument("--json", help="write the numbers here")
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.replace(",", " ").split()]
    cpu = st_load(a.cpu)
    (n, V), ref = cpu["logits"]
    if n != len(ids):
        raise SystemExit("%s: %d rows, %d ids" % (a.cpu, n, len(ids)))
    rec = {"name": a.name, "n": n, "vocab": V, "tol_backend": TOL_BACKEND, "tol_hf": TOL_HF}
    ok, parts = True, []

    if a.cuda:
        cu = st_load(a.cuda)
        d, r = logits_rel(cu["logits"][1], ref)
        terms = {k: term_rel(cu[k][1][0], cpu[k][1][0]) for k in ("lm_loss", "aux_loss", "z_loss")}
        good = r <= TOL_BACKEND and all(t <= TOL_BACKEND for t in terms.values())
        rec["cuda_vs_cpu"] = {"max_abs": d, "rel": r, "terms_rel": terms, "ok": good}
        parts.append("cuda vs cpu rel %.1e, lm/aux/z %s (tol %g) %s" % (
            r, "/".join("%.0e" % t for t in terms.values()), TOL_BACKEND, "ok" if good else "FAIL"))
        ok &= good

    skipped = None
    if a.hf:
        got, desc = hf_forward(a.hf, ids)
        if got is None:
            skipped = desc
        else:
            rec["hf"] = {"impl": desc}
            for side, path in (("cuda", a.cuda), ("cpu", a.cpu)):
                if not path:
                    continue
                other = st_load(path)
                d, r = logits_rel(got, other["logits"][1])
                good = r <= TOL_HF
                rec["hf"]["vs_" + side] = {"max_abs": d, "rel": r, "ok": good}
                parts.append("HF vs %s rel %.1e %s" % (side, r, "ok" if good else "FAIL"))
                ok &= good
            lm_hf = mean_ce(got, n, V, ids)
            lm_mt = (st_load(a.cuda) if a.cuda else cpu)["lm_loss"][1][0]
            r = term_rel(lm_hf, lm_mt)
            rec["hf"]["lm_loss"] = {"hf": lm_hf, "meshtrain": lm_mt, "rel": r, "ok": r <= TOL_HF}
            parts.append("HF lm loss rel %.1e (tol %g) %s" % (r, TOL_HF, "ok" if r <= TOL_HF else "FAIL"))
            ok &= r <= TOL_HF
            print("hf %s: %s; lm loss HF %.7g meshtrain %.7g; %s" % (a.name, desc, lm_hf, lm_mt, json.dumps(rec["hf"])))

    rec["ok"] = ok
    rec["hf_skipped"] = skipped
    if a.json:
        json.dump(rec, open(a.json, "w"), indent=1)
    if "cuda_vs_cpu" in rec:
        print("hf %s: cuda vs cpu %s" % (a.name, json.dumps(rec["cuda_vs_cpu"])))
    print("RESULT hf %s: %s" % (a.name, ", ".join(parts) if parts else "nothing compared"))
    if skipped:
        print("SKIPPED (hf %s: HF part: %s)" % (a.name, skipped))
    sys.exit(1 if not ok else (77 if skipped else 0))


if __name__ == "__main__":
    main()
