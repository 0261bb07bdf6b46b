#!/usr/bin/env python3
"""gpu_profile.py — a planner device profile from bench/cuda_calib's measurements.

    python3 bench/profiles/gpu_profile.py CALIB.json [--smi SMI.csv] [--precision bf16|fp32]
        [--base bench/profiles/h100-8x-nvlink-ib.json] [--datasheet NAME] [--receipt R.json]
        [--out bench/profiles/h100-measured.json]

Writes a profile in the format `meshtrain plan --profile FILE` loads
(src/plan/plan.c, mt_plan_profile_load), every number's provenance in
"sources" (docs/cuda.md, "Calibrating the planner's GPU profile"):

  peak_flops     the datasheet dense peak of the GEMM precision (the table of
                 src/plan/gpu_info.c, which the receipt's mfu_device uses):
                 bf16 tensor cores, or IEEE fp32 (meshtrain's fp32 mode is
                 cublasSgemm without TF32);
  by_precision   {"fp32": {peak_flops, efficiency}, "bf16": {...}}: both GEMM
                 precisions cuda_calib timed, so that `plan` times a config
                 by its own precision (src/plan/plan.c); the top-level
                 peak_flops / efficiency are --precision's;
  efficiency     measured GEMM FLOP/s / peak_flops: the FLOP-weighted rate
                 (sum FLOPs / sum median times) over the d_model 2048 layer
                 shapes of cuda_calib (every shape when it ran none). That is
                 a GEMM ceiling, above an end-to-end MFU; --receipt R takes
                 the end-to-end figure of a `meshtrain train` receipt on the
                 same device instead (its model FLOP/s / peak_flops);
  memory_bytes   nvidia-smi memory.total (MiB) with --smi, else cuda_calib's
                 cudaGetDeviceProperties total, else the base profile's;
  links          a one-GPU run crosses no link: the base profile's datasheet
                 values are kept and "sources" says so. (cuda_calib's one-rank
                 NCCL all-reduce bandwidth is recorded under "measured", not
                 used as a link.)
  the rest       (node_peak_flops = peak x ranks_per_node, overlap,
                 ranks_per_node, runtime_memory) from the base profile.

--smi takes the output of
`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`
(first line). Exit 1 with a message when the calibration failed its check,
the device is not in the datasheet table (give --datasheet), or an input
is missing a field.
"""
import argparse
import json
import os
import re
import sys

# The datasheet table is src/plan/gpu_info.c's PEAKS (the receipt's mfu_device
# uses it), read from the source rather than copied: one table, first substring
# match wins. Rows: {"match", bf16 dense, fp32, "source"},
PEAK_ROW = re.compile(r'\{"([^"]+)",\s*([0-9.eE+]+),\s*([0-9.eE+]+),\s*"([^"]+)"\}')



def sig6(v):
    """6 significant digits (not 6 decimals: an emulated run's efficiency ~1e-7 must not round to 0,
    which the planner refuses)."""
    return float("%.6g" % v)

def peaks_table():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "plan", "gpu_info.c")
    try:
        text = open(src).read()
    except OSError as e:
        fail("cannot read the datasheet table: %s" % e)
    body = text[text.index("PEAKS[]"):] if "PEAKS[]" in text else ""
    rows = [(k, float(b), float(f), sv) for k, b, f, sv in PEAK_ROW.findall(body[:body.find("};") + 1])]
    if not rows:
        fail("no datasheet rows found in %s (PEAKS)" % src)
    return rows


def fail(msg):
    print("gpu_profile: " + msg, file=sys.stderr)
    sys.exit(1)


def datasheet(name):
    for key, bf16, fp32, src in peaks_table():
        if key in name:
            return key, bf16, fp32, src
    return None


def grouped_rate(rows, kernel="mma"):
    """cuda_calib's grouped rows of one kernel family at its tile (bn 256): sum FLOPs / sum median s;
    for wgmma only when its three rows (forward, dx, dW) each matched the mma.sync result"""
    use = [g for g in rows
           if g.get("bn") == 256 and g.get("kernel", "mma") == kernel and g.get("grouped_median_s", 0) > 0]
    if kernel == "wgmma" and not (len(use) == 3 and all(g.get("ok") is True for g in use)):
        return None
    return sum(g["flops"] for g in use) / sum(g["grouped_median_s"] for g in use) if use else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("calib")
    ap.add_argument("--smi", help="nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits output")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--base", default=None, help="profile whose links/overlap/runtime_memory are kept")
    ap.add_argument("--datasheet", help="datasheet row to use (e.g. H100) when the device name matches none")
    ap.add_argument("--receipt", help="a meshtrain train receipt on this device: end-to-end efficiency")
    ap.add_argument("--name", default="h100-measured")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    base_path = a.base or os.path.join(here, "h100-8x-nvlink-ib.json")
    out_path = a.out or os.path.join(here, a.name + ".json")

    try:
        cal = json.load(open(a.calib))
        base = json.load(open(base_path))
    except (OSError, ValueError) as e:
        fail("cannot read input: %s" % e)
    if cal.get("tool") != "cuda_calib":
        fail("%s is not cuda_calib output" % a.calib)
    if not cal.get("check", {}).get("ok"):
        fail("the calibration's gemm check failed (%s): its timings are not used" % cal.get("check"))
    dev = cal["device"]
    smi_name, smi_mem = None, None
    if a.smi:
        line = open(a.smi).read().strip().splitlines()
        if not line or "," not in line[0]:
            fail("--smi %s: expected 'name, memory.total' (csv, noheader, nounits)" % a.smi)
        smi_name, mem = (x.strip() for x in line[0].rsplit(",", 1))
        try:
            smi_mem = int(float(mem)) * 1048576
        except ValueError:
            fail("--smi %s: memory.total '%s' is not a number of MiB" % (a.smi, mem))
    name = smi_name or dev["name"]
    row = datasheet(a.datasheet or name)
    if row is None:
        fail("device '%s' is not in the datasheet table (src/plan/gpu_info.c): give --datasheet" % name)
    key, bf16_peak, fp32_peak, peak_src = row
    peak = bf16_peak if a.precision == "bf16" else fp32_peak
    emulated = bool(dev.get("emulated"))

    # GEMM rate of a precision: cuda_calib's "bf16" (operands as stored, the
    # weights' shadows) or "fp32" rows; layer shapes when there are any
    def gemm_rate(kind):
        rows = [g for g in cal["gemm"] if g["precision"] == kind]
        if not rows:
            return None, None
        layer = [g for g in rows if g["set"].startswith("layer")]
        use = layer or rows
        return (sum(g["flops"] for g in use) / sum(g["median_s"] for g in use),
                ", ".join("%dx%dx%d" % (g["m"], g["n"], g["k"]) for g in use))

    def eff_source(kind, rate, shapes, e):
        return ("measured: %s GEMM %.4g FLOP/s (sum FLOPs / sum median time over %s, y = x W^T, cuda_calib %s) / "
                "peak = %.4f. A GEMM ceiling: the end-to-end rate (attention, elementwise ops, optimizer) is lower"
                % (kind, rate, shapes, "on the CPU emulator: NOT a GPU figure" if emulated else "on " + name, e))

    kind = "bf16" if a.precision == "bf16" else "fp32"
    rate, shapes = gemm_rate(kind)
    if rate is None:
        fail("no %s gemm rows in %s" % (kind, a.calib))
    gemm_eff = rate / peak
    eff, eff_src = gemm_eff, eff_source(kind, rate, shapes, gemm_eff)
    if a.receipt:
        r = json.load(open(a.receipt))
        mfps = (r.get("timing") or {}).get("model_flops_per_s")
        if not mfps:
            fail("--receipt %s: no model_flops_per_s" % a.receipt)
        world = (r.get("mesh") or {}).get("world", 1)
        eff = mfps / world / peak
        eff_src = ("measured end to end: receipt %s, model FLOP/s per rank %.4g / peak_flops = %.4f "
                   "(the GEMM-only figure was %.4f)" % (a.receipt, mfps / world, eff, gemm_eff))
    if not eff > 0:
        fail("efficiency %r is not > 0" % eff)

    if smi_mem:
        mem, mem_src = smi_mem, "nvidia-smi memory.total on the calibrated device: %d MiB" % (smi_mem >> 20)
    elif dev.get("mem_total_bytes"):
        mem, mem_src = dev["mem_total_bytes"], "cudaGetDeviceProperties totalGlobalMem (cuda_calib)%s" % (
            ", CPU emulator: not a GPU's" if emulated else "")
    else:
        mem, mem_src = base.get("memory_bytes", 0), "kept from %s" % os.path.basename(base_path)

    rpn = base.get("ranks_per_node", 1)
    prof = {
        "name": a.name,
        "description": "%s calibrated by bench/cuda_calib.c (%s GEMMs)%s; links, overlap and runtime memory "
                       "from %s" % (name, a.precision, " UNDER THE CPU EMULATOR (format check only)" if emulated
                                    else "", os.path.basename(base_path)),
        "peak_flops": peak,
        "node_peak_flops": peak * rpn,
        "efficiency": sig6(eff),
        "memory_bytes": mem,
        "overlap": base.get("overlap", 0),
        "ranks_per_node": rpn,
        "links": base["links"],
        "runtime_memory": base.get("runtime_memory"),
    }
    if prof["runtime_memory"] is None:
        del prof["runtime_memory"]
    # both precisions cuda_calib measured: the planner picks the entry of the
    # config's precision (a bf16 profile must not time an fp32 run)
    prof["by_precision"] = {}
    for k, pk in (("fp32", fp32_peak), ("bf16", bf16_peak)):
        if k == kind:   # --precision's entry: the efficiency chosen above (GEMM or --receipt)
            prof["by_precision"][k] = {"peak_flops": pk, "efficiency": sig6(eff), "source": eff_src}
            continue
        r_k, sh_k = gemm_rate(k)
        if r_k is not None:
            prof["by_precision"][k] = {"peak_flops": pk, "efficiency": sig6(r_k / pk),
                                       "source": eff_source(k, r_k, sh_k, r_k / pk)}
    ar = cal.get("allreduce", {})
    att = cal.get("attention") or []
    prof["measured"] = {
        "device": name, "emulated": emulated, "cc": dev.get("cc"), "sm_count": dev.get("sm_count"),
        "driver_version": dev.get("driver_version"), "runtime_version": dev.get("runtime_version"),
        "gemm_flop_per_s": {k: v for k, v in cal.get("gemm_best_flop_per_s", {}).items()},
        "gemm_efficiency_used": sig6(gemm_eff),
        "attention_fwd_bwd_flop_per_s": cal.get("attention_best_fwd_bwd_flop_per_s"),
        "attention_precision": cal.get("attention_precision"),
        "attention_fraction_of_peak_fp32": (cal.get("attention_best_fwd_bwd_flop_per_s") or 0) / fp32_peak,
        # precision=bf16's attention (tensor cores); None from a calib run before it existed
        "attention_bf16_fwd_bwd_flop_per_s": cal.get("attention_bf16_best_fwd_bwd_flop_per_s"),
        # the Mamba-3 chunked scan, fwd+bwd, FLOPs as the recurrence (plan.c's
        # MT_PLAN_KIND_SCAN rate); None from a calib run before the scan row
        "scan_fwd_bwd_flop_per_s": cal.get("scan_best_fwd_bwd_flop_per_s"),
        # ... its precision=bf16 entries (ssm_scan_*_bf16, the products on tensor cores):
        # what the planner uses for a bf16 config; None from a calib run before them
        "scan_bf16_fwd_bwd_flop_per_s": cal.get("scan_bf16_best_fwd_bwd_flop_per_s") or None,
        # the MoE experts' grouped kernels (gemm_grouped_rows / _sum, mma.sync) at the
        # default tile (bn 256): sum FLOPs / sum median time over the forward, dx and dW
        # rows; the planner prices the experts' share of the GEMM FLOPs at it (precision=bf16)
        "gemm_grouped_bf16_flop_per_s": grouped_rate(cal.get("grouped") or []),
        # ... on wgmma (knob grouped_gemm_kernel=wgmma): the planner's rate for a run with
        # that knob; None unless all three rows ran and matched the mma.sync results
        "gemm_grouped_wgmma_bf16_flop_per_s": grouped_rate(cal.get("grouped_wgmma") or [], "wgmma"),
        # Muon's batched bf16 Newton-Schulz (cuda_calib's muon_ns rows: sum FLOPs / sum
        # time): the planner's optimizer rate where that iteration runs; None before it
        "muon_ns_bf16_flop_per_s": cal.get("muon_ns_bf16_flop_per_s") or None,
        "scan_shapes": sorted({"%dx%dx%dx%dx%dx%d" % (x["b"], x["t"], x["h"], x["p"], x["n"], x["chunk"])
                               for x in cal.get("scan") or []}),
        "allreduce_one_rank": ({"comm": ar.get("comm"), "best_algbw_bytes_per_s": ar.get("best_algbw_bytes_per_s")}
                               if ar.get("available") else {"available": False, "why": ar.get("why")}),
        "device_copy_bytes_per_s": (cal.get("device_copy") or {}).get("best_bytes_per_s"),
        "attention_shapes": sorted({"%dx%dx%dx%d" % (x["b"], x["t"], x["h"], x["hd"]) for x in att}),
    }
    node_src = "peak_flops x ranks_per_node (%d, from %s)" % (rpn, os.path.basename(base_path))
    bsrc = base.get("sources", {})
    link_note = ("one GPU: no link was measured (a one-rank all-reduce crosses none%s); kept from %s: "
                 % ("" if not ar.get("available") else
                    ", its %.4g B/s one-rank NCCL figure is under measured" % ar.get("best_algbw_bytes_per_s", 0),
                    os.path.basename(base_path)))
    prof["sources"] = {
        "peak_flops": "%s; %s peak taken (meshtrain %s: %s)" % (
            peak_src, a.precision, a.precision,
            "cuBLASLt bf16 operands, fp32 accumulation" if a.precision == "bf16" else "cublasSgemm IEEE fp32, no TF32"),
        "node_peak_flops": node_src,
        "efficiency": eff_src,
        "memory_bytes": mem_src,
        "intra_node": link_note + bsrc.get("intra_node", "the base profile's value"),
        "inter_node": link_note + bsrc.get("inter_node", "the base profile's value"),
        "overlap": "kept from %s: %s" % (os.path.basename(base_path), bsrc.get("overlap", "")),
        "calibration": "bench/cuda_calib.c JSON %s (%s reps, median; gemm check %s)" % (
            a.calib, cal.get("reps"), cal["check"]),
    }
    with open(out_path, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
    print("gpu_profile: wrote %s: %s peak %.4g, efficiency %.4f (%s), memory %d MiB%s" % (
        out_path, a.precision, peak, eff, "receipt" if a.receipt else "GEMM", mem >> 20,
        " [EMULATED]" if emulated else ""))


if __name__ == "__main__":
    main()
