#!/usr/bin/env python3
"""The side-by-side run of scripts/bench-vs-llamacpp (read that first):
both systems on the same weights, interleaved A B B A ..., medians and the
per-round ratio range, one table.

usage: bench-vs-llamacpp.py OURS_BIN LLAMA_BIN WORK ROUNDS SHAPE...
       bench-vs-llamacpp.py --table WORK/bench-vs.json
  OURS_BIN   holds mcompile and bench/bench_vs (a Release tree)
  LLAMA_BIN  holds llama-bench, llama-quantize, llama-batched-bench
  WORK       models and artifacts (kept between runs: generated once)
  SHAPE      smollm | tinyllama (bench-vs-llamacpp-gen.py)
BASE_BIN in the environment: a second Release tree of ours (an older
commit with bench_vs.c copied in) run on the same artifacts in the same
rounds (A B C A B C), printed as the "before" column.
VS_FORMATS in the environment: a comma-separated subset of the formats'
names to run (e.g. "int8,int4-sym g32"); default all.
Prints the table on stdout and writes WORK/bench-vs.json (every raw
figure, the load averages, the date, and per round the share of the
machine's CPU time other processes took, from /proc/stat less both
systems' own: over 10 % in any round of a format, the table says
DISTURBED under it); --table prints the table of such a file again
without running anything.
"""
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS = 2
NTG = 32  # decode tokens per measurement (llama-bench -n, bench_vs --ntg)
FORMATS = [  # (ours, --quant args, llama.cpp type, llama-quantize type)
    ("f16", ["--quant", "f16"], "F16", None),
    ("int8", ["--quant", "int8"], "Q8_0", "Q8_0"),
    # like for like: our asymmetric int4 (scale + zero per group) against
    # Q4_1 (scale + min per block), our symmetric int4 against Q4_0; the
    # output layer (a tied model's embedding) in the same int4, as
    # llama-quantize --pure writes output.weight / token_embd
    ("int4 g32", ["--quant", "int4", "--group", "32", "--lm-head", "int4"],
     "Q4_1", "Q4_1"),
    ("int4-sym g32", ["--quant", "int4-sym", "--group", "32",
                      "--lm-head", "int4-sym"], "Q4_0", "Q4_0"),
]


def loadavg():
    return os.getloadavg()[0]


def busy_cpu_s():
    """CPU seconds every process on the machine has run since boot
    (/proc/stat: all but idle and iowait), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# A round in which other processes took more than this share of the
# machine's CPU time is flagged as disturbed in the table: the load
# average cannot tell (our own 2 threads hold it near 2), and a build or
# a test run beside one round has moved its figures 4x on this host.
FOREIGN_MAX = 0.10


def run(cmd, **kw):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"bench-vs-llamacpp: {' '.join(cmd)} failed ({p.returncode}):\n"
                 f"{p.stderr[-3000:]}")
    return p, dt


def gguf_step_bytes(path):
    """Bytes of the matrices a decode step reads (token_embd only when it
    is also the output layer, as our weight_bytes counts)."""
    import gguf  # llama.cpp's gguf-py: a run needs it, --table does not
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    tot = 0
    for t in r.tensors:
        if len(t.shape) < 2:
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        tot += int(t.n_bytes)
    return tot


def ours_compile(bin_dir, hf, fmt_args, out):
    cmd = [f"{bin_dir}/mcompile", hf, "--target", "64GiB", *fmt_args,
           "--max-batch", "8", "--max-seq", "640", "--prefill-chunk", "512",
           "--threads", str(THREADS), "-o", out, "-q"]
    if os.path.exists(out):
        os.unlink(out)
    return run(cmd)[1]


def llama_quantize(bin_dir, src, dst, qtype):
    if os.path.exists(dst):
        os.unlink(dst)
    return run([f"{bin_dir}/llama-quantize", "--pure", src, dst, qtype,
                str(THREADS)])[1]


def ours_round(bin_dir, art):
    p, _ = run([f"{bin_dir}/bench/bench_vs", art, "--threads", str(THREADS),
                "--ntg", str(NTG)])
    return json.loads(p.stdout.strip().splitlines()[-1])


def probe(ours_bin):
    """The read probe bench_vs runs right before its batch-1 decode,
    alone: taken right before llama.cpp's batch-1 decode too, so each
    system's b1 figure has the read bandwidth of its moment (this host
    switches between a ~35 and a ~65 GB/s phase within a minute)."""
    p, _ = run([f"{ours_bin}/bench/bench_vs", "none", "--threads", str(THREADS),
                "--only", "probe"])
    return json.loads(p.stdout.strip().splitlines()[-1])["read_gbs"]


def llama_round(bin_dir, model, ours_bin):
    def bench(pn):
        p, _ = run([f"{bin_dir}/llama-bench", "-m", model, "-t", str(THREADS),
                    *pn, "-r", "1", "-o", "json"])
        return json.loads(p.stdout)

    # the prefills, then the probe, then batch-1 decode: bench_vs's order
    out = bench(["-p", "128,512", "-n", "0"])
    res = {"read_gbs": probe(ours_bin)}
    out += bench(["-p", "0", "-n", str(NTG)])
    for e in out:
        if e["n_prompt"] == 128 and e["n_gen"] == 0:
            res["pp128"] = e["avg_ts"]
        elif e["n_prompt"] == 512 and e["n_gen"] == 0:
            res["pp512"] = e["avg_ts"]
        elif e["n_gen"] == NTG:
            res["tg1"] = e["avg_ts"]
    p, _ = run([f"{bin_dir}/llama-batched-bench", "-m", model, "-t",
                str(THREADS), "-c", "2048", "-b", "2048", "-ub", "512",
                "-npp", "128", "-ntg", str(NTG), "-npl", "8",
                "--output-format", "jsonl"])
    for line in (p.stdout + "\n" + p.stderr).splitlines():  # LOG may be either
        if line.startswith("{") and '"speed_tg"' in line:
            res["tg8"] = json.loads(line)["speed_tg"]
    m = re.search(r"load time =\s*([0-9.]+) ms", p.stderr + p.stdout)
    res["load_s"] = float(m.group(1)) / 1000.0 if m else float("nan")
    return res


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        with open(sys.argv[2]) as f:
            print_table(json.load(f))
        return
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    ours_bin, llama_bin, work, rounds = sys.argv[1:5]
    base_bin = os.environ.get("BASE_BIN")
    rounds = int(rounds)
    shapes = sys.argv[5:]
    pick = os.environ.get("VS_FORMATS")
    formats = [f for f in FORMATS
               if not pick or f[0] in [p.strip() for p in pick.split(",")]]
    if not formats:
        sys.exit(f"VS_FORMATS={pick!r} names none of "
                 f"{', '.join(f[0] for f in FORMATS)}")
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "threads": THREADS, "rounds": rounds, "shapes": {}}
    load0 = loadavg()
    for shape in shapes:
        d = os.path.join(work, shape)
        hf, f16 = os.path.join(d, "hf"), os.path.join(d, "f16.gguf")
        if not os.path.exists(f16):
            os.makedirs(d, exist_ok=True)
            print(f"== {shape}: generating the weights", file=sys.stderr)
            run([sys.executable, os.path.join(HERE, "bench-vs-llamacpp-gen.py"),
                 shape, hf, f16])
        sr = report["shapes"][shape] = {}
        for name, qargs, ltype, lq in formats:
            art = os.path.join(d, name.replace(" ", "") + ".mca")
            lmodel = f16 if lq is None else os.path.join(d, f"{ltype}.gguf")
            q_ours, q_llama = [], []
            # quantize (and compile) interleaved; the last output is kept
            for r in range(rounds if lq else 1):
                print(f"== {shape} {name}: compile/quantize round {r + 1}",
                      file=sys.stderr)
                q_ours.append(ours_compile(ours_bin, hf, qargs, art))
                if lq:
                    q_llama.append(llama_quantize(llama_bin, f16, lmodel, lq))
            ours, llama, base, foreign = [], [], [], []
            for r in range(rounds):
                print(f"== {shape} {name}: run round {r + 1} (load "
                      f"{loadavg():.1f})", file=sys.stderr)
                # odd rounds in the reverse order: whoever runs first in a
                # round does not always get the same state of the machine
                steps = [lambda: ours.append(ours_round(ours_bin, art)),
                         lambda: llama.append(llama_round(llama_bin, lmodel,
                                                          ours_bin))]
                if base_bin:
                    steps.append(lambda: base.append(ours_round(base_bin, art)))
                b0, c0, t0 = busy_cpu_s(), children_cpu_s(), time.monotonic()
                for step in (steps if r % 2 == 0 else steps[::-1]):
                    step()
                # CPU time the machine ran that was not ours or llama.cpp's
                if b0 is not None:
                    wall = time.monotonic() - t0
                    other = (busy_cpu_s() - b0) - (children_cpu_s() - c0)
                    foreign.append(max(other, 0.0) / (wall * (os.cpu_count() or 1)))
            sr[name] = {
                "llama_type": ltype,
                "ours_raw": ours, "llama_raw": llama, "before_raw": base,
                "quant_s_ours": q_ours, "quant_s_llama": q_llama,
                "f16_bytes": os.path.getsize(os.path.join(hf, "model.safetensors")),
                "weight_bytes_ours": ours[0]["weight_bytes"],
                "weight_bytes_llama": gguf_step_bytes(lmodel),
                "foreign_cpu_share": foreign,
            }
    report["load_avg"] = [load0, loadavg()]
    with open(os.path.join(work, "bench-vs.json"), "w") as f:
        json.dump(report, f, indent=1)
    print_table(report)


PHASE_TOL = 0.2  # probes within 20 % of each other: the same phase


def same_phase_line(o, l):
    """Decode b1 is bound by the read bandwidth, which moves between two
    phases here: its ratio over only the rounds whose two probes (each
    right before the system's batch-1 decode) agree."""
    if not l or not all("read_gbs" in y for y in l):
        return  # a report from before the llama.cpp probe
    pairs = [(x, y) for x, y in zip(o, l)
             if abs(x["read_gbs"] - y["read_gbs"])
             <= PHASE_TOL * max(x["read_gbs"], y["read_gbs"])]
    same = [x["tg1"] / y["tg1"] for x, y in pairs if x["tg1"] and y["tg1"]]
    probes = ", ".join(f"{x['read_gbs']:.0f}/{y['read_gbs']:.0f}"
                       for x, y in zip(o, l))
    verdict = (f"b1 ratio {med(same):.2f} over the {len(same)} of {len(o)} "
               f"rounds in one phase" if same else "no round in one phase")
    print(f"  {'':<20} {'probe GB/s':<16} ours/llama.cpp by round {probes}: "
          f"{verdict}")


def print_table(rep):
    print(f"mcompile vs llama.cpp, {rep['date']}, {rep['threads']} threads, "
          f"median of {rep['rounds']} interleaved rounds, load avg "
          f"{rep['load_avg'][0]:.1f} -> {rep['load_avg'][1]:.1f}")
    for shape, sr in rep["shapes"].items():
        print(f"\n{shape}")
        print(f"  {'format':<20} {'figure':<16} {'ours':>9} {'llama.cpp':>9} "
              f"{'ratio':>6} {'ours/bound':>10} {'llama/bound':>11} {'before':>9} "
              f"{'rounds':>11}")
        for name, r in sr.items():
            o, l = r["ours_raw"], r["llama_raw"]
            bw = med([x["read_gbs"] for x in o]) * 1e9
            label = f"{name} vs {r['llama_type']}"
            for key, fig in [("tg1", "decode b1 tok/s"), ("tg8", "decode b8 tok/s"),
                             ("pp128", "prefill128 tok/s"),
                             ("pp512", "prefill512 tok/s"), ("load_s", "load s")]:
                a, b = med([x[key] for x in o]), med([x[key] for x in l])
                ratio = (b / a if key == "load_s" else a / b) if a and b else float("nan")
                bound = f"{'':10} {'':11}"
                if key in ("tg1", "tg8"):
                    batch = 1 if key == "tg1" else 8
                    fo = a / batch * r["weight_bytes_ours"] / bw
                    fl = b / batch * r["weight_bytes_llama"] / bw
                    bound = f"{100 * fo:9.0f}% {100 * fl:10.0f}%"
                before = ""
                if r.get("before_raw"):
                    before = f"{med([x[key] for x in r['before_raw']]):9.2f}"
                # the ratio of each round's own pair: its spread is how far
                # one round's verdict can be trusted on this machine
                per = [(y[key] / x[key] if key == "load_s" else x[key] / y[key])
                       for x, y in zip(o, l)
                       if x[key] and y[key] and math.isfinite(x[key] / y[key])]
                spread = f"{min(per):5.2f}-{max(per):<5.2f}" if per else ""
                print(f"  {label:<20} {fig:<16} {a:9.2f} {b:9.2f} {ratio:6.2f} "
                      f"{bound} {before or '':>9} {spread:>11}")
                label = ""
            if r["quant_s_llama"]:
                a, b = med(r["quant_s_ours"]), med(r["quant_s_llama"])
                mb = r["f16_bytes"] / 1e6
                print(f"  {'':<20} {'quantize MB/s':<16} {mb / a:9.1f} {mb / b:9.1f} "
                      f"{b / a:6.2f}   ({a:.2f} s vs {b:.2f} s from f16)")
            same_phase_line(o, l)
            fs = r.get("foreign_cpu_share") or []
            if fs and max(fs) > FOREIGN_MAX:
                print(f"  {'':<20} DISTURBED: other processes took "
                      f"{', '.join(f'{100 * x:.0f}' for x in fs)} % of the CPU "
                      f"in the rounds (over {100 * FOREIGN_MAX:.0f} %): rerun")
            print(f"  {'':<20} {'step bytes MB':<16} {r['weight_bytes_ours'] / 1e6:9.1f} "
                  f"{r['weight_bytes_llama'] / 1e6:9.1f}   read bw "
                  f"{bw / 1e9:.2f} GB/s (this run); our pool wake-up "
                  f"{med([x['wake_us'] for x in o]):.2f} us")
            if all("tg1_cpu_ms" in x for x in o):
                print(f"  {'':<20} {'our CPU ms/token':<16} b1 "
                      f"{med([x['tg1_cpu_ms'] for x in o]):.2f}, b8 "
                      f"{med([x['tg8_cpu_ms'] for x in o]):.2f} (all threads, "
                      f"spinning included)")
    print("\nratio: ours/llama.cpp (load: llama.cpp/ours), higher is better for "
          "us; bound: the read bandwidth of this run / bytes a step reads; "
          "before: BASE_BIN's runtime on the same artifacts; rounds: the "
          "lowest and highest ratio of a single round (rounds alternate the "
          "order of the systems); probe: the read bandwidth right before "
          "each system's batch-1 decode, and decode b1's ratio over the rounds "
          f"whose two probes are within {100 * PHASE_TOL:.0f} %")


if __name__ == "__main__":
    main()
