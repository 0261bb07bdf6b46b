#!/usr/bin/env python3
"""check_predictions.py [BUILD_DIR] [OUT_JSON] — the cost model against receipts.

Runs a set of `meshtrain train` configurations on this machine (one rank with
all cores, and 2 or 4 MPI ranks with one thread each), then asks
`meshtrain plan --json --profile cpu-local` for the same setup and compares
the predicted step time with the receipt's best steady step (the first 2
steps excluded). This machine is shared and has minutes when it runs several
times slower (identical runs: 0.61 s vs 6 s per step); the best step keeps
those out, and the mean steady step is kept in OUT_JSON too.

Two predictions per run:
  profile   the cpu-local profile as it is (peak, links, efficiency);
  same-roof the same, with the peak replaced by the sgemm roof the run itself
            measured at startup (receipt timing.peak_flops / world), which
            takes out how fast this shared machine happened to be that minute.
Prints a markdown table (docs/plan.md) and writes the raw numbers to OUT_JSON.
"""
import json, os, subprocess, sys, tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
OUTJ = sys.argv[2] if len(sys.argv) > 2 else None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MT = os.path.join(ROOT, BUILD, "meshtrain")
PROFILE = os.path.join(ROOT, "bench", "profiles", "cpu-local.json")
STEPS = int(os.environ.get("STEPS", "8"))

TINY = ["--set", "vocab_size=64", "--set", "n_layer=2", "--set", "d_model=32", "--set", "n_head=4",
        "--set", "n_kv_head=4", "--set", "seq_len=16", "--set", "batch_size=8"]
A, B, C = "bench/configs/a_dense.json", "bench/configs/b_moe.json", "bench/configs/c_gpt2small.json"
# (label, np, config file or None, extra --set args, mesh, zero)
RUNS = [
    ("a dense", 1, A, [], "dp=1", 0),
    ("a dense, recompute=block", 1, A, ["--set", "recompute=block"], "dp=1", 0),
    ("b moe", 1, B, [], "dp=1", 0),
    ("c gpt2-small (5 steps)", 1, C, [], "dp=1", 0),
    ("a dense", 2, A, [], "dp=2", 0),
    ("a dense", 2, A, [], "dp=2", 1),
    ("a dense", 2, A, [], "dp=2", 3),
    ("a dense", 2, A, [], "tp=2", 0),
    ("a dense, 4 microbatches", 2, A, ["--set", "microbatches=4"], "pp=2", 0),
    ("b moe", 2, B, [], "ep=2", 1),
    ("a dense (2 ranks per core)", 4, A, [], "dp=2,tp=2", 1),
    ("tiny dense (d=32, 2 layers)", 2, None, TINY, "dp=2", 0),
]


def run(cmd, env=None):
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout[-2000:]))
    return r.stdout


def main():
    tmp = tempfile.mkdtemp(prefix="mt-pred-")
    data = os.path.join(tmp, "data.bin")
    run(["python3", "tests/make_shard.py", data, "400000", "8192", "random"])
    tiny = os.path.join(tmp, "tiny.bin")
    run(["python3", "tests/make_shard.py", tiny, "20000", "64", "pattern"])
    prof = json.load(open(PROFILE))
    rows = []
    for i, (label, np_, cfg, extra, mesh, zero) in enumerate(RUNS):
        out = os.path.join(tmp, "r%d" % i)
        steps = 5 if "gpt2" in label else STEPS
        args = (["--config", cfg] if cfg else []) + extra
        train = [MT, "train"] + args + ["--data", tiny if cfg is None else data, "--out", out, "--steps", str(steps),
                                       "--mesh", mesh, "--zero", str(zero), "--quiet"]
        env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
        if np_ > 1:
            env["OMP_NUM_THREADS"] = "1"
            train = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-x", "OMP_NUM_THREADS", "-np", str(np_)] + train
        else:
            env["OMP_NUM_THREADS"] = str(os.cpu_count())
        run(train, env)
        rec = json.load(open(os.path.join(out, "receipt.json")))
        G, T = rec["config"]["batch_size"], rec["config"]["seq_len"]
        steady = rec["timing"]["step_times_s"][rec["timing"]["warmup_steps_excluded"]:]
        mean = G * T / rec["timing"]["tokens_per_s"]
        meas = min(steady)   # the best steady step: see the module comment
        plan = [MT, "plan"] + args + ["--world", str(np_), "--mesh", mesh, "--zero", str(zero), "--steps", str(steps),
                                      "--json", "--profile", PROFILE]
        c1 = json.loads(run(plan))["cost"]
        # the same with this run's own roof as the peak
        p2 = dict(prof, peak_flops=rec["timing"]["peak_flops"] / np_, node_peak_flops=rec["timing"]["peak_flops"])
        p2path = os.path.join(tmp, "p%d.json" % i)
        json.dump(p2, open(p2path, "w"))
        c2 = json.loads(run(plan[:-1] + [p2path]))["cost"]
        split = rec["timing"]["step_time_split_s"]
        row = {"label": label, "ranks": np_, "mesh": mesh, "zero": zero, "measured_step_s": meas,
               "measured_mean_step_s": mean,
               "predicted_step_s": c1["step_s"], "predicted_same_roof_s": c2["step_s"],
               "run_roof_per_rank": rec["timing"]["peak_flops"] / np_, "measured_comm_s_per_step":
               split["communication"] / rec["timing"]["steps_run"], "predicted_comm_s":
               c1["tp_comm_s"] + c1["ep_comm_s"] + c1["pp_comm_s"] + c1["dp_exposed_s"], "mfu": rec["timing"]["mfu"]}
        rows.append(row)
        print("%-32s %d %-10s z%d  measured %.4g s  predicted %.4g s (x%.2f)  same-roof %.4g s (x%.2f)" % (
            label, np_, mesh, zero, meas, c1["step_s"], c1["step_s"] / meas, c2["step_s"], c2["step_s"] / meas),
            file=sys.stderr)
    print("| run | ranks | mesh | ZeRO | best step s (mean) | predicted (profile) | pred/meas | predicted (run's roof) | pred/meas | comm meas / pred s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %s | %d | %s | %d | %.4g (%.3g) | %.4g | %.2f | %.4g | %.2f | %.3g / %.3g |" % (
            r["label"], r["ranks"], r["mesh"], r["zero"], r["measured_step_s"], r["measured_mean_step_s"], r["predicted_step_s"],
            r["predicted_step_s"] / r["measured_step_s"], r["predicted_same_roof_s"],
            r["predicted_same_roof_s"] / r["measured_step_s"], r["measured_comm_s_per_step"], r["predicted_comm_s"]))
    if OUTJ:
        json.dump({"profile": prof["name"], "steps": STEPS, "runs": rows}, open(OUTJ, "w"), indent=1)


if __name__ == "__main__":
    main()
