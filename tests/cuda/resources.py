#!/usr/bin/env python3
"""resources.py — what each kernel launch asks of an sm_90 SM (H100, H200),
from the registers and shared memory nvcc gave the kernel and the launch
geometry the emulator logged (tests/test_cuda_build.sh stage r; docs/cuda.md
"Launch resources").

  resources.py check --res DIR [--log LOG ...] [--spill-allow FILE] [--table OUT]

  DIR: a CUDA build made with MT_CUDA_RESOURCE_LOG=ON; every OBJECT.res
  under it holds ptxas's --resource-usage lines (cmake/nvcc_resources.sh).
  LOG: MT_CUDA_LAUNCH_LOG files of emulated runs ("launch NAME grid X Y Z
  block X Y Z threads N smem S"), in any number.

  The emulator runs a launch that a GPU refuses: it has no register file
  and its shared memory is a host vector. This joins the two. Fails on:
    - a launch whose block needs more registers than an SM has
      (cudaErrorLaunchOutOfResources on the GPU): warps x the registers of a
      warp (a thread's count x 32, in units of 256) > 65536;
    - a launch whose static + dynamic shared memory is over the 227 KiB a
      block may have (the emulator checks the opt-in above 48 KiB, not this
      sum: the static part is nvcc's);
    - a kernel that spills (spill stores or loads > 0) and is not in the
      allow-list FILE ("name  reason" a line, # comments): a spill is local
      memory traffic in the inner loop, a speed regression to be named;
    - a launched kernel that no .res file names (the table would be
      incomplete, so the other checks would pass by not looking);
    - a kernel whose wgmmas ptxas serialized ("Potential Performance Loss:
      wgmma.mma_async instructions are serialized", C7514-C7518...): it
      still computes right, as the emulator sees it, at a fraction of the
      speed, and only this line says so;
    - a kernel where ptxas injected a warpgroup.arrive (C7519): a plain
      access to an accumulator compiled across a wgmma.fence or wait
      (register access there is undefined), which the emulator, running in
      program order, cannot see.
  Kernels are matched by name without template arguments: a kernel's
  instantiations share a name and their largest registers, spills and
  static shared memory are used (the conservative side). Prints, per
  launched kernel and geometry, the blocks an SM holds and what limits them
  (warps, registers, shared memory), and NOTEs for compiled kernels no
  emulated run launched and allow-list entries that no longer spill.
"""
import collections
import os
import re
import subprocess
import sys

# sm_90 (compute capability 9.0: H100, H200), CUDA occupancy rules
SM_REGS = 65536          # registers an SM and a block may hold
REG_UNIT = 256           # a warp's registers are allocated in units of 256
SM_WARPS = 64
SM_BLOCKS = 32
SM_SMEM = 233472         # 228 KiB an SM
BLOCK_SMEM = 232448      # 227 KiB a block (static + dynamic)
BLOCK_SMEM_RESERVED = 1024   # the runtime's per-block reserve


def split_name(name):
    """(kernel name without qualifiers, its template arguments without
    spaces or None): "void k<16, true>(float*)" -> ("k", "16,true")"""
    name = name.replace("(anonymous namespace)::", "").strip("()& ")
    if name.startswith("void "):
        name = name[5:]
    base = re.split(r"[<(]", name, 1)[0]
    args = None
    if name[len(base):].startswith("<"):
        depth = 0
        for i in range(len(base), len(name)):
            depth += {"<": 1, ">": -1}.get(name[i], 0)
            if depth == 0:
                args = name[len(base) + 1:i].replace(" ", "")
                break
    return base.rsplit("::", 1)[-1].strip(), args


def read_res(root):
    """{mangled: {regs, spill_st, spill_ld, stack, smem}} of every kernel entry, the .res
    files, [(mangled, ptxas code, file)] of every kernel whose wgmmas ptxas serialized, and the
    same of every kernel where ptxas injected a warpgroup.arrive (C7519)"""
    ents, cur, serial, arrive = {}, None, [], []
    files = []
    for dirpath, _, names in os.walk(root):
        files += [os.path.join(dirpath, n) for n in names if n.endswith(".res")]
    for path in sorted(files):
        for line in open(path, errors="replace"):
            m = re.search(r"\((C75\d\d)\) Potential Performance Loss: wgmma.*function '([^']+)'", line)
            if m:
                serial.append((m.group(2), m.group(1), os.path.basename(path)))
                continue
            m = re.search(r"\((C7519)\) warpgroup.arrive is injected.*function '([^']+)'", line)
            if m:
                arrive.append((m.group(2), m.group(1), os.path.basename(path)))
                continue
            m = re.search(r"Compiling entry function '([^']+)'", line)
            if m:
                cur = m.group(1)
                ents[cur] = {"regs": 0, "spill_st": 0, "spill_ld": 0, "stack": 0, "smem": 0,
                             "file": os.path.basename(path)}
                continue
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                cur = m.group(1) if m.group(1) in ents else None
                continue
            if cur is None:
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                e = ents[cur]
                e["stack"], e["spill_st"], e["spill_ld"] = (int(x) for x in m.groups())
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m:
                ents[cur]["regs"] = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                ents[cur]["smem"] = int(s.group(1)) if s else 0
    return ents, files, serial, arrive


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def read_logs(paths):
    """{base name: {(template arguments as launched, threads per block, dynamic smem): launches}}"""
    seen = collections.defaultdict(collections.Counter)
    for p in paths:
        for line in open(p):
            w = line.split()
            if len(w) < 10 or w[0] != "launch":
                continue
            tpb = int(w[7]) * int(w[8]) * int(w[9])
            smem = int(w[w.index("smem") + 1]) if "smem" in w else 0
            base, args = split_name(w[1])
            seen[base][(args or "", tpb, smem)] += 1
    return seen


def occupancy(regs, tpb, smem):
    """(blocks an SM holds, the limit's name, registers a block needs)"""
    warps = (tpb + 31) // 32
    per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    block_regs = warps * per_warp
    lim = {"blocks": SM_BLOCKS, "warps": SM_WARPS // warps,
           "registers": (SM_REGS // per_warp) // warps,
           "smem": SM_SMEM // (smem + BLOCK_SMEM_RESERVED) if smem else SM_BLOCKS}
    why = min(lim, key=lambda k: (lim[k], k != "blocks"))
    return lim[why], why, block_regs


def check(argv):
    def opt(flag, many=False):
        vals = [argv[i + 1] for i, a in enumerate(argv) if a == flag and i + 1 < len(argv)]
        return vals if many else (vals[0] if vals else None)
    res_dir, logs, allow_path, table = opt("--res"), opt("--log", True), opt("--spill-allow"), opt("--table")
    ents, files, serial, arrive = read_res(res_dir)
    if not ents:
        print("FAIL: no ptxas resource lines under %s (%d .res files): build with MT_CUDA_RESOURCE_LOG=ON"
              % (res_dir, len(files)))
        return 1
    dem = demangle(sorted(set(ents) | set(m for m, _, _ in serial + arrive)))
    kern = {}   # base -> merged (max) resources, instantiations
    inst = {}   # (base, template arguments) -> resources
    for m, e in ents.items():
        b, args = split_name(dem.get(m, m))
        inst[(b, args or "")] = e
        k = kern.setdefault(b, {"regs": 0, "spill_st": 0, "spill_ld": 0, "stack": 0, "smem": 0, "n": 0,
                                "file": e["file"]})
        for f in ("regs", "spill_st", "spill_ld", "stack", "smem"):
            k[f] = max(k[f], e[f])
        k["n"] += 1
    allow = {}
    if allow_path:
        for line in open(allow_path):
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, why = line.partition(" ")
                allow[name] = why.strip()
    seen = read_logs(logs)
    err, rows = [], []
    for b in sorted(seen):
        if b not in kern:
            err.append("%s launched (%s) but no .res file names it" % (b, ", ".join(logs)))
            continue
        for (args, tpb, dyn), n in sorted(seen[b].items()):
            # the instantiation the log names (literal template arguments), else
            # the largest of the kernel's ("<HD,MW>": the caller's names)
            exact = (b, args) in inst
            k = inst[(b, args)] if exact else kern[b]
            name = "%s<%s>" % (b, args) if args and exact else b if kern[b]["n"] == 1 else "%s (max of %d)" % (
                b, kern[b]["n"])
            total = k["smem"] + dyn
            blocks, why, block_regs = occupancy(k["regs"], tpb, total)
            rows.append((blocks * ((tpb + 31) // 32), name, tpb, dyn, k, blocks, why, n))
            if block_regs > SM_REGS:
                err.append("%s: %d threads x %d registers = %d registers a block > %d (launch fails: out of resources)"
                           % (name, tpb, k["regs"], block_regs, SM_REGS))
            if total > BLOCK_SMEM:
                err.append("%s: %d bytes static + %d dynamic shared memory > %d a block" % (name, k["smem"], dyn,
                                                                                           BLOCK_SMEM))
    for b, code, f in sorted(set((split_name(dem.get(m, m))[0], code, f) for m, code, f in arrive)):
        err.append("%s: ptxas injected a warpgroup.arrive (%s, %s): a plain access to a wgmma accumulator was "
                   "compiled across its wgmma.fence or wait (undefined in the PTX ISA; pin it with "
                   "mt_wgmma_fence_operand, wgmma.cuh)" % (b, code, f))
    for b, code, f in sorted(set((split_name(dem.get(m, m))[0], code, f) for m, code, f in serial)):
        err.append("%s: ptxas serialized its wgmmas (%s, %s): each waits for the one before, the async pipeline "
                   "is gone (a branch around wgmma not provably warpgroup-uniform, or a plain instruction on an "
                   "accumulator in flight)" % (b, code, f))
    for b, k in sorted(kern.items()):
        if (k["spill_st"] or k["spill_ld"]) and b not in allow:
            err.append("%s spills (%d bytes stores, %d loads; %s) and is not in the allow-list"
                       % (b, k["spill_st"], k["spill_ld"], k["file"]))
    lines = ["%-34s %7s %8s %5s %6s %6s %6s %6s  %s" % ("kernel", "threads", "dyn smem", "regs", "static", "spill",
                                                        "blocks", "warps", "limit (blocks an SM; warps of 64)")]
    for warps, b, tpb, dyn, k, blocks, why, n in sorted(rows, key=lambda r: (r[0], r[1])):
        lines.append("%-34s %7d %8d %5d %6d %6d %6d %6d  %s%s" % (
            b[:34], tpb, dyn, k["regs"], k["smem"], k["spill_st"] + k["spill_ld"], blocks, warps, why,
            "  (spills)" if k["spill_st"] or k["spill_ld"] else ""))
    if table:
        with open(table, "w") as f:
            f.write("\n".join(lines) + "\n")
    for line in lines:
        print("   " + line)
    never = sorted(b for b in kern if b not in seen)
    if never:
        print("   NOTE: %d compiled kernels no emulated run launched here (not checked): %s"
              % (len(never), " ".join(never)))
    for b in sorted(allow):
        if b in kern and not (kern[b]["spill_st"] or kern[b]["spill_ld"]):
            print("   NOTE: spill allow-list entry %s no longer spills (remove it)" % b)
    for e in err:
        print("FAIL:", e)
    if not err:
        low = sum(1 for r in rows if r[0] < 16)
        print("%d kernels (%d instantiations) in %d .res files; %d launched, %d geometries checked: every block fits an "
              "SM; %d geometries under 16 of 64 warps an SM" % (len(kern), len(ents), len(files), len(seen), len(rows),
                                                               low))
    return 1 if err else 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "check":
        sys.exit(__doc__)
    sys.exit(check(sys.argv[2:]))
