#!/usr/bin/env python3
"""`kvslim bench` against llama.cpp's `llama-bench` on the same GGUF files, alternating, with the
speed targets of docs/PERFORMANCE.md's table checked pair by pair. Python standard library only;
llama-bench is built outside this repository (bench/README.md, "llama.cpp, built outside this
repository").

    python3 bench/bench_compare.py --kvslim build/kvslim \
        --llama-bench ~/llama.cpp/build/bin/llama-bench \
        --llama-bench-avx2 ~/llama.cpp/build-avx2/bin/llama-bench \
        --q8_0 /dev/shm/kv/tinyllama-q8_0.gguf --q4_k_m /dev/shm/kv/tinyllama-q4_k_m.gguf \
        --groups short,d4096 --levels native,avx2 --rounds 2 -t 2 --out /tmp/compare

Groups of tests (each a kvslim run and a llama.cpp run on the same file):
  short   for each model: pp512 (prefill of 512 tokens from an empty cache) and decode at depth 512
          (tg32 @ d512; kvslim with --floor, so its paired read floor and thread hand-off are kept)
  dN      the --depth-model file (Q8_0 unless named) at depth N: the prefill of N tokens (kvslim's
          `fill dN`; llama.cpp's untimed depth fill, timed here from its --progress lines), decode at
          N with the full f16 cache, and kvslim's compressed cache against llama.cpp's full cache:
          SnapKV 0.75 (compression after every 1,024-token chunk), or with --depth-budget B SnapKV
          keeping at most B entries per KV head after every chunk
Levels: `native` runs kvslim at the level it detects against --llama-bench; `avx2` runs kvslim with
KVSLIM_SIMD=avx2 against --llama-bench-avx2 (a build without AVX-512), or against --llama-bench
where the CPU has no AVX-512 (then the two levels are the same and `native` alone is enough).

In round r the two engines run kvslim first when r is odd, llama.cpp first when r is even. Each
ratio is kvslim / llama.cpp of one round (llama.cpp at its faster flash-attention setting of
--llama-fa, or --llama-fa-depth for the dN groups), so both sides of a ratio ran minutes apart.
The output folder (a new one: one whose raw/ holds files is refused) gets every raw output (raw/),
results.json (one record per test and round, and the failed runs) and summary.md (the machine and
settings, one line per ratio with its target, each test's range over the rounds, the failed runs);
summary.md is also printed. Exit status 0 when every run succeeded (targets met or not), 1 when a
run failed, 2 on bad arguments.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402  (its cpu_seconds reads a process's CPU time from /proc)

# Targets (docs/PERFORMANCE.md's speed table): ratio kvslim / llama.cpp, by test and depth.
PP512_TARGET = 1.2
DECODE512_TARGET = 1.1
FLOOR_TARGET = 0.80  # Q4_K_M decode at 512: share of kvslim's paired read floor (median token)
PREFILL_TARGETS = {4096: 1.5, 16384: 2.0, 32768: 2.5}
DECODE_TARGETS = {4096: 1.2, 16384: 2.0, 32768: 2.5}
SNAPKV_TARGETS = {4096: 1.5, 16384: 3.0}  # SnapKV 0.75
BUDGET_TARGETS = {32768: 4.0}  # SnapKV under a per-head budget (--depth-budget)
# The weight type kvslim's JSON reports (model_type) for each model flag.
EXPECTED_TYPE = {"q8_0": "q8_0", "q4_k_m": "q4_K"}


class CompareError(Exception):
    """A failed run or an output that cannot be read; the message names the command or file."""


def cpu_description():
    """(model name, family, the SIMD flags that choose kvslim's level) from /proc/cpuinfo."""
    name, family, flags = "unknown", "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "unknown":
                    name = value.strip()
                elif key == "cpu family" and family == "?":
                    family = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]
    return name, family, [f for f in wanted if f in flags]


def filesystem_of(path):
    """The file system type of the mount holding `path` (tmpfs for /dev/shm), from /proc/mounts."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")):
                    if len(parts[1]) > len(best):
                        best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def machine_state():
    """The load average and the transparent huge page setting (both move speed figures)."""
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "unknown"
    thp = read("/sys/kernel/mm/transparent_hugepage/enabled")
    if "[" in thp:
        thp = thp[thp.index("[") + 1:thp.index("]")]
    return f"load average {' '.join(read('/proc/loadavg').split()[:3])}, transparent huge pages {thp}"


def run_kvslim(args, level, cmd_args, stem):
    """Runs `kvslim bench` with --json; returns its rows. stem: raw/ path without extension."""
    env = dict(os.environ)
    if level == "avx2":
        env["KVSLIM_SIMD"] = "avx2"
    else:
        env.pop("KVSLIM_SIMD", None)
    cmd = [args.kvslim, "bench", *cmd_args, "-t", str(args.threads), "--no-progress", "--json", stem + ".json"]
    with open(stem + ".txt", "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        raise CompareError(f"kvslim exited {rc}: {' '.join(cmd)} (output in {stem}.txt)")
    try:
        with open(stem + ".json") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CompareError(f"{stem}.json: cannot read kvslim's JSON: {e}")


def run_llama(binary, cmd_args, stem):
    """Runs llama-bench with -o json --progress; returns (rows, fill_seconds, fill_cpu_seconds).
    The fill is the time between its "depth run" and "generation run" progress lines (llama-bench
    does not time its depth fill); both are None when the run had no depth."""
    cmd = [binary, *cmd_args, "--progress", "-o", "json"]
    stamps = {}
    with open(stem + ".json", "w") as out, open(stem + ".err", "w") as err:
        err.write("$ " + " ".join(cmd) + "\n")
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise CompareError(f"cannot run llama-bench {binary}: {e}")
        for line in proc.stderr:
            t = time.monotonic()
            try:
                c = serve_client.cpu_seconds(proc.pid)
            except (OSError, IndexError, ValueError):  # the process ended after its last line
                c = None
            err.write(f"[{t:.3f} s, cpu {c}] {line}")
            for phase in ("depth run", "generation run"):
                if phase in line and phase not in stamps:
                    stamps[phase] = (t, c)
        rc = proc.wait()
    if rc != 0:
        raise CompareError(f"llama-bench exited {rc}: {' '.join(cmd)} (stderr in {stem}.err)")
    try:
        with open(stem + ".json") as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        raise CompareError(f"{stem}.json: cannot read llama-bench's JSON: {e}")
    fill = fill_cpu = None
    if "depth run" in stamps and "generation run" in stamps:
        (t0, c0), (t1, c1) = stamps["depth run"], stamps["generation run"]
        fill = max(t1 - t0, 1e-6)  # a fill of a few tokens can end within the clock's resolution
        fill_cpu = c1 - c0 if c0 is not None and c1 is not None else None
    return rows, fill, fill_cpu


def kvslim_row(rows, test, press="none"):
    """The row of kvslim's JSON whose `test` is `test` for the press named `press` (the JSON gives
    its full spec, e.g. snapkv:ratio=0.75,window=64,...); CompareError if absent."""
    for r in rows:
        if r.get("test") == test and str(r.get("press", "")).split(":")[0] == press:
            return r
    raise CompareError(f"kvslim's output has no row {test!r} for press {press!r}")


def llama_best(rows, n_prompt, n_gen, n_depth):
    """The fastest row (over flash-attention settings) of llama-bench's JSON for one test."""
    match = [r for r in rows if r.get("n_prompt") == n_prompt and r.get("n_gen") == n_gen
             and r.get("n_depth", 0) == n_depth]
    if not match:
        raise CompareError(f"llama-bench's output has no test p{n_prompt} n{n_gen} d{n_depth}")
    return max(match, key=lambda r: r["avg_ts"])


def ratio_record(test, level, model, rnd, kv, ll, target, extra=None):
    """One line of the summary: kvslim and llama.cpp t/s, their ratio and whether it meets target."""
    ratio = kv / ll if ll > 0 else float("inf")
    rec = {"test": test, "level": level, "model": model, "round": rnd, "kvslim_ts": kv, "llama_ts": ll,
           "ratio": ratio, "target": target, "met": None if target is None else ratio >= target}
    rec.update(extra or {})
    return rec


def in_round_order(rnd, kvslim, llama):
    """Runs the two engines' steps, kvslim first in odd rounds and llama.cpp first in even ones."""
    for step in ((kvslim, llama) if rnd % 2 else (llama, kvslim)):
        step()


def kvslim_notes(row, model):
    """What a record keeps of a kvslim row: its SIMD level, and, where the file's weights are not
    the type its flag names, that type (flagged on every line of the file)."""
    notes = {"simd": row.get("simd")}
    if row.get("model_type") != EXPECTED_TYPE[model]:
        notes["model_type"] = row.get("model_type")
    return notes


def decode_notes(row, model):
    """kvslim_notes of a decode row, with its threads' hand-off and its paired floor share."""
    return {**kvslim_notes(row, model), "handoff_ns": row.get("handoff_ns"),
            "floor_share": row.get("paired_floor_share_median")}


def run_short(args, level, llama_bin, model, path, rnd, raw):
    """pp and decode at the short depth for one model: kvslim and llama.cpp in the round's order."""
    p, d, n = args.prompt, args.short_depth, args.n_gen
    stem = os.path.join(raw, f"{level}-short-{model}-r{rnd}")
    fa = ["-fa", args.llama_fa]
    out = {}

    def kvslim():
        # Two runs, as llama-bench's below: kvslim bench runs every -p test at every --depth, and the
        # prefill test here is at depth 0.
        rows = run_kvslim(args, level, ["-m", path, "-p", str(p), "-n", "0", "-r", str(args.reps)],
                          stem + "-kvslim-pp")
        out["kv"] = rows + run_kvslim(args, level, ["-m", path, "-p", "0", "--depth", str(d), "-n", str(n), "-r",
                                                    str(args.reps), "--floor"], stem + "-kvslim-tg")

    def llama():
        rows, _, _ = run_llama(llama_bin, ["-m", path, "-t", str(args.threads), "-p", str(p), "-n", "0", "-r",
                                           str(args.reps), *fa], stem + "-llama-pp")
        rows2, _, _ = run_llama(llama_bin, ["-m", path, "-t", str(args.threads), "-p", "0", "-n", str(n), "-d",
                                            str(d), "-r", str(args.reps), *fa], stem + "-llama-tg")
        out["ll"] = rows + rows2

    in_round_order(rnd, kvslim, llama)
    kv, ll = out["kv"], out["ll"]
    recs = []
    pp = kvslim_row(kv, f"pp{p}")
    llp = llama_best(ll, p, 0, 0)
    recs.append(ratio_record(f"pp{p}", level, model, rnd, pp["avg_ts"], llp["avg_ts"],
                             PP512_TARGET if p == 512 else None,
                             {**kvslim_notes(pp, model), "llama_fa": llp.get("flash_attn")}))
    tg = kvslim_row(kv, f"tg{n} @ d{d}")
    llt = llama_best(ll, 0, n, d)
    recs.append(ratio_record(f"decode at {d}", level, model, rnd, tg["avg_ts"], llt["avg_ts"],
                             DECODE512_TARGET if d == 512 else None,
                             {**decode_notes(tg, model), "llama_fa": llt.get("flash_attn"),
                              "read_gbps": tg.get("read_gbps")}))
    if model == "q4_k_m" and d == 512:
        share = tg.get("paired_floor_share_median") or 0.0
        recs.append({"test": "decode at 512, share of the paired read floor", "level": level, "model": model,
                     "round": rnd, "share": share, "target": FLOOR_TARGET, "met": share >= FLOOR_TARGET,
                     "handoff_ns": tg.get("handoff_ns")})
    return recs


def depth_press(args):
    """kvslim bench's arguments for the dN groups' compressed cache, the label of its test, and its
    target by depth."""
    if args.depth_budget:
        return (["--press", f"snapkv:budget={args.depth_budget}"], f"SnapKV budget {args.depth_budget}",
                BUDGET_TARGETS)
    return ["--press", "snapkv", "--compression-ratio", "0.75"], "SnapKV 0.75", SNAPKV_TARGETS


def run_depth(args, level, llama_bin, model, path, depth, rnd, raw):
    """The prefill of `depth` tokens and decode at `depth` (full cache; kvslim also its compressed
    cache, depth_press)."""
    n = args.depth_n_gen
    stem = os.path.join(raw, f"{level}-d{depth}-{model}-r{rnd}")
    press_args, press_label, press_targets = depth_press(args)
    out = {}

    def kvslim():
        out["kv"] = run_kvslim(args, level, ["-m", path, "-p", "0", "--depth", str(depth), "-n", str(n), "-r", "1",
                                             "--floor", "--press", "none", *press_args,
                                             "--chunk-size", str(args.chunk_size)],
                               stem + "-kvslim")

    def llama():
        runs = []  # one per -fa value; the fastest fill and the fastest decode are kept, maybe from two
        for fa in args.llama_fa_depth.split(","):
            rows, fill, fill_cpu = run_llama(llama_bin, ["-m", path, "-t", str(args.threads), "-fa", fa, "-p", "0",
                                                         "-n", str(n), "-d", str(depth), "-r", "1", "--no-warmup"],
                                             f"{stem}-llama-fa{fa}")
            if fill is None:
                raise CompareError(f"{stem}-llama-fa{fa}.err: no 'depth run' / 'generation run' progress lines")
            runs.append({"fill_ts": depth / fill, "fill_s": fill, "fill_cpu_s": fill_cpu, "fa": fa,
                         "tg_ts": llama_best(rows, 0, n, depth)["avg_ts"]})
        out["ll"] = {"fill": max(runs, key=lambda r: r["fill_ts"]), "tg": max(runs, key=lambda r: r["tg_ts"])}

    in_round_order(rnd, kvslim, llama)
    kv, ll = out["kv"], out["ll"]
    fill = kvslim_row(kv, f"fill d{depth}")
    full = kvslim_row(kv, f"tg{n} @ d{depth}")
    snap = kvslim_row(kv, f"tg{n} @ d{depth}", "snapkv")
    return [
        ratio_record(f"prefill of {depth}", level, model, rnd, fill["avg_ts"], ll["fill"]["fill_ts"],
                     PREFILL_TARGETS.get(depth), {**kvslim_notes(fill, model), "llama_fill_s": ll["fill"]["fill_s"],
                                                  "kvslim_fill_s": depth / fill["avg_ts"],
                                                  "llama_fill_cpu_s": ll["fill"]["fill_cpu_s"],
                                                  "llama_fa": ll["fill"]["fa"]}),
        ratio_record(f"decode at {depth}, full f16 cache", level, model, rnd, full["avg_ts"], ll["tg"]["tg_ts"],
                     DECODE_TARGETS.get(depth), {**decode_notes(full, model), "llama_fa": ll["tg"]["fa"]}),
        ratio_record(f"decode at {depth}, {press_label} (llama.cpp: full cache)", level, model, rnd, snap["avg_ts"],
                     ll["tg"]["tg_ts"], press_targets.get(depth), decode_notes(snap, model)),
    ]


def write_results(out, header, recs, failures):
    """results.json: the header lines, one record per ratio, and the failed runs' messages."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"header": header, "records": recs, "failures": failures}, f, indent=1)


def summary(recs, header, failures=()):
    """summary.md's text: the machine and files, one line per record, then each test's range over
    the rounds and the failed runs."""
    lines = list(header)
    lines += ["", "| test | level | model | round | kvslim | llama.cpp | ratio | target | met | notes |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        notes = []
        if r.get("simd"):
            notes.append(f"kvslim simd {r['simd']}")
        if r.get("handoff_ns"):
            notes.append("hand-off " + " / ".join(f"{x:.0f}" for x in r["handoff_ns"]) + " ns")
        if r.get("model_type"):
            notes.append(f"**the file's weights are {r['model_type']}, not {r['model']}**")
        if r.get("floor_share") and "share" not in r:
            notes.append(f"kvslim at {r['floor_share']:.0%} of its paired read floor")
        if r.get("llama_fa") is not None:
            notes.append(f"llama.cpp -fa {r['llama_fa']}")
        target = "" if r["target"] is None else (f"{r['target']:.0%}" if "share" in r else f"{r['target']:g}x")
        met = "" if r["met"] is None else ("met" if r["met"] else "**missed**")
        if "share" in r:
            lines.append(f"| {r['test']} | {r['level']} | {r['model']} | {r['round']} | {r['share']:.0%} | | | "
                         f"{target} | {met} | {'; '.join(notes)} |")
        else:
            lines.append(f"| {r['test']} | {r['level']} | {r['model']} | {r['round']} | {r['kvslim_ts']:.2f} | "
                         f"{r['llama_ts']:.2f} | {r['ratio']:.2f}x | {target} | {met} | {'; '.join(notes)} |")
    # Each test's range over the rounds (the ratio, or the floor share).
    groups = {}
    for r in recs:
        groups.setdefault((r["test"], r["level"], r["model"]), []).append(r)
    if groups:
        lines += ["", "| test | level | model | rounds | range | met |", "|---|---|---|---|---|---|"]
        for (test, level, model), rs in groups.items():
            vals = [x["share"] if "share" in x else x["ratio"] for x in rs]
            fmt = (lambda v: f"{v:.0%}") if "share" in rs[0] else (lambda v: f"{v:.2f}x")
            met = "" if rs[0]["target"] is None else f"{sum(bool(x['met']) for x in rs)} of {len(rs)}"
            lines.append(f"| {test} | {level} | {model} | {len(rs)} | {fmt(min(vals))} - {fmt(max(vals))} | {met} |")
    judged = [r for r in recs if r["met"] is not None]
    lines += ["", f"{sum(r['met'] for r in judged)} of {len(judged)} targets met "
                  f"(t/s; prefill rows: tokens over the fill's wall time; targets exist for pp512, decode at 512, "
                  f"and depths 4,096, 16,384 and 32,768 only)"]
    if failures:
        lines += ["", f"**{len(failures)} failed run(s)** (their tests have no line above):"]
        lines += [f"- {m}" for m in failures]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvslim", required=True, help="the kvslim binary")
    ap.add_argument("--llama-bench", required=True, help="llama.cpp's llama-bench (native build)")
    ap.add_argument("--llama-bench-avx2", help="llama-bench built without AVX-512, for --levels avx2")
    ap.add_argument("--q8_0", help="Q8_0 GGUF (kvslim synth --shape tinyllama-1.1b --type q8_0)")
    ap.add_argument("--q4_k_m", help="Q4_K_M GGUF (kvslim synth --shape tinyllama-1.1b --type q4_k_m)")
    ap.add_argument("--groups", default="short", help="comma list of short and dN (e.g. d4096,d16384)")
    ap.add_argument("--levels", default="native", help="comma list of native and avx2")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (alternating which engine runs first)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="repetitions inside each short run (-r)")
    ap.add_argument("--prompt", type=int, default=512, help="short group's prompt (pp) length")
    ap.add_argument("--short-depth", type=int, default=512, help="short group's decode depth")
    ap.add_argument("--n-gen", type=int, default=32, help="short group's decode steps")
    ap.add_argument("--depth-n-gen", type=int, default=16, help="dN groups' decode steps")
    ap.add_argument("--chunk-size", type=int, default=1024, help="SnapKV's compression chunk in dN groups")
    ap.add_argument("--depth-model", default="q8_0", choices=("q8_0", "q4_k_m"),
                    help="the file the dN groups run (--q8_0 or --q4_k_m)")
    ap.add_argument("--depth-budget", type=int, default=0,
                    help="dN groups: SnapKV keeps at most this many entries per KV head (0: SnapKV 0.75)")
    ap.add_argument("--llama-fa", default="0,1", help="llama-bench -fa values for the short group (best kept)")
    ap.add_argument("--llama-fa-depth", default="0", help="llama-bench -fa values for dN groups (a run each)")
    ap.add_argument("--out", required=True, help="output folder (created)")
    args = ap.parse_args(argv)

    def bad(msg):
        print(f"bench_compare: {msg}", file=sys.stderr)
        return 2

    groups = [g for g in args.groups.split(",") if g]
    if not groups:
        return bad("--groups: empty (short, or dN such as d4096)")
    depths = []
    for g in groups:
        if g == "short":
            continue
        if not (g.startswith("d") and g[1:].isdigit() and int(g[1:]) > 0):
            return bad(f"--groups: unknown group {g!r} (short, or dN such as d4096)")
        depths.append(int(g[1:]))
    levels = [lv for lv in args.levels.split(",") if lv]
    name, family, flags = cpu_description()
    for lv in levels:
        if lv not in ("native", "avx2"):
            return bad(f"--levels: unknown level {lv!r} (native, avx2)")
    if "avx2" in levels and "avx512f" in flags and not args.llama_bench_avx2:
        return bad("--levels avx2 on a CPU with AVX-512 needs --llama-bench-avx2 (llama.cpp built without AVX-512)")
    for what, path in (("--kvslim", args.kvslim), ("--llama-bench", args.llama_bench),
                       ("--llama-bench-avx2", args.llama_bench_avx2)):
        if path and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return bad(f"{what} {path}: not an executable file")
    models = []
    if "short" in groups:
        models = [(m, p) for m, p in (("q8_0", args.q8_0), ("q4_k_m", args.q4_k_m)) if p]
        if not models:
            return bad("the short group needs --q8_0 or --q4_k_m")
    depth_path = args.q8_0 if args.depth_model == "q8_0" else args.q4_k_m
    if depths and not depth_path:
        return bad(f"the dN groups need --{args.depth_model} (--depth-model {args.depth_model})")
    if args.depth_budget < 0:
        return bad(f"--depth-budget {args.depth_budget}: must be >= 0")
    for m, p in (("--q8_0", args.q8_0), ("--q4_k_m", args.q4_k_m)):
        if p and not os.path.isfile(p):
            return bad(f"{m} {p}: no such file")
    for flag in ("rounds", "threads", "reps", "prompt", "short_depth", "n_gen", "depth_n_gen", "chunk_size"):
        if getattr(args, flag) < 1:
            return bad(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be >= 1")

    raw = os.path.join(args.out, "raw")
    try:
        if os.path.isdir(raw) and os.listdir(raw):
            return bad(f"--out {args.out}: its raw/ already holds an earlier run's files; give a new folder")
        os.makedirs(raw, exist_ok=True)
    except OSError as e:
        return bad(f"--out {args.out}: cannot create the output folder ({e.strerror})")
    header = [f"# kvslim bench against llama-bench ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
              f"- CPU: {name} (family {family}); flags: {' '.join(flags) or 'none of the SIMD ones'}",
              f"- threads {args.threads}; levels {', '.join(levels)} (avx2: kvslim with KVSLIM_SIMD=avx2"
              + (f", llama.cpp {args.llama_bench_avx2})" if args.llama_bench_avx2 else ")"),
              f"- kvslim: {args.kvslim}; llama.cpp: {args.llama_bench}",
              f"- {args.rounds} rounds (kvslim first in odd ones); short group: pp{args.prompt}, tg{args.n_gen} @ "
              f"d{args.short_depth}, -r {args.reps} (both engines), llama.cpp -fa {args.llama_fa}; dN groups: "
              f"{args.depth_model}, tg{args.depth_n_gen}, {depth_press(args)[1]}, llama.cpp -fa {args.llama_fa_depth}",
              "- hand-off: one way between kvslim's first two threads, before / after its decode test (tens of ns: "
              "the two cores share a last-level cache, one chiplet; hundreds: two chiplets)",
              f"- at the start: {machine_state()}"]
    for m, p in (("Q8_0", args.q8_0), ("Q4_K_M", args.q4_k_m)):
        if p:
            header.append(f"- {m}: {p} ({filesystem_of(p)})")
    # Each job runs one group for one model or depth: job(level, llama-bench binary, round) -> records.
    jobs = ([lambda lv, lb, rnd, m=m, p=p: run_short(args, lv, lb, m, p, rnd, raw) for m, p in models]
            + [lambda lv, lb, rnd, d=d: run_depth(args, lv, lb, args.depth_model, depth_path, d, rnd, raw) for d in depths])
    recs, failures = [], []
    for rnd in range(1, args.rounds + 1):
        for lv in levels:
            llama_bin = args.llama_bench_avx2 if lv == "avx2" and args.llama_bench_avx2 else args.llama_bench
            for job in jobs:
                try:
                    recs += job(lv, llama_bin, rnd)
                except CompareError as e:
                    print(f"bench_compare: {e}", file=sys.stderr)
                    failures.append(f"round {rnd}, {lv}: {e}")
                write_results(args.out, header, recs, failures)
    header.append(f"- at the end: {machine_state()}")
    write_results(args.out, header, recs, failures)
    text = summary(recs, header, failures)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
