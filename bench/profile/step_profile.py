#!/usr/bin/env python3
"""Where one training step's time goes, by component, from `perf` samples.

    python3 bench/profile/step_profile.py [--presets small,base] [--recipes fp32,bf16,nvfp4,mxfp8] [--by-role]

Runs `target/release/bench step` (build it first: `cargo build --release -p bench`) once per
preset and recipe under `perf record --call-graph dwarf` (software cpu-clock sampling, which
works where hardware counters are not exposed), on ONE thread: rayon's worker threads do not
carry their caller's stack, so only a one-thread run attributes every sample to its GEMM role.
Each sample inside `Trainer::train_step` is assigned, from its call chain's source lines, to a
GEMM role (`ops/linear.rs`: Fprop / Dgrad / Wgrad) and within it to the f32 GEMM, the AMX tiles,
packing into BF16 tiles, quantization or the alpha epilogue, or else to the autograd op it ran
in. Prints a Markdown table of the percentages and the sampled ms per step (with `--by-role`,
also each GEMM role's split into those parts). The warmup step is recorded too: its first
touches of the step's buffers are the page-fault rows (a step after it takes almost none:
`perf stat -e page-faults` counts 35,540 for warmup + 1 step and 35,544 for warmup + 6).
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

FREQ = 499

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def samples(text):
    """Call chains (leaf first) as lists of [symbol, file:line]."""
    cur = None
    for line in text.splitlines():
        if re.match(r"^\s*\d+\s*$", line):
            if cur:
                yield cur
            cur = []
        elif cur is None or not line.strip():
            continue
        elif line.startswith("\t"):
            parts = line.strip().split(None, 1)
            cur.append([parts[1] if len(parts) > 1 else "?", ""])
        elif cur:
            cur[-1][1] = line.strip().split()[0]
    if cur:
        yield cur


def linear_ranges():
    """Line ranges of the forward GEMM and the dgrad / wgrad closures in ops/linear.rs."""
    src = open(os.path.join(ROOT, "autograd/src/ops/linear.rs")).read().splitlines()
    find = lambda pat: next(i + 1 for i, l in enumerate(src) if pat in l)
    bw, dg, wg = find("backward_fn(move"), find("let dgrad ="), find("let wgrad =")
    end = next(i + 1 for i in range(wg, len(src)) if src[i].strip() == "};")
    return bw, dg, wg, end


def role(frames, ranges):
    bw, dg, wg, end = ranges
    for _, src in frames:
        m = re.match(r"linear\.rs:(\d+)", src)
        if m:
            n = int(m.group(1))
            if n < bw:
                return "Fprop"
            if dg <= n < wg:
                return "Dgrad"
            if wg <= n <= end:
                return "Wgrad"
            return None
    return None


def gemm_part(frames):
    syms = " ".join(f[0] for f in frames[:14])
    srcs = " ".join(f[1] for f in frames[:14])
    if re.search(r"page_fault|clear_page|handle_mm", syms):
        return "page faults (warmup step)"
    if re.search(r"pack::pack_(tile|chunks|k_runs|[ab]\b)|pack_avx512::|bf16_bits|store_transposed", syms):
        return "pack into BF16 tiles"
    if "bf16::block" in syms or "block_2x2" in syms or "amx.rs" in srcs:
        return "BF16 unit (AMX, vdpbf16ps)"
    if "matrixmultiply" in syms:
        return "f32 GEMM (sgemm)"
    if "qgemm::finish" in syms:
        return "alpha epilogue"
    if re.search(r"nvfp4|::mx::|fp8|fake|hadamard|philox|amax|quant::bf16|grid", syms + srcs):
        return "quantize"
    return "other"


OPS = [
    ("attention", "attention (head gather with RoPE, products, softmax)"),
    ("shape_ops", "shape ops (split, transpose)"),
    ("activation.rs", "activations"),
    ("norm.rs", "norms"),
    ("rope", "RoPE"),
    ("elementwise", "elementwise"),
    ("round_bf16", "BF16 rounding of activations"),
    ("optim::", "optimizer (clip + AdamW)"),
    ("cross_entropy", "cross-entropy"),
]
PARTS = ["f32 GEMM (sgemm)", "BF16 unit (AMX, vdpbf16ps)", "pack into BF16 tiles", "quantize", "alpha epilogue",
         "page faults (warmup step)", "other"]


def classify(frames, ranges):
    r = role(frames, ranges)
    if r:
        return "GEMM " + r, gemm_part(frames)
    s = " ".join(f[0] + " " + f[1] for f in frames)
    for key, name in OPS:
        if key in s:
            return name, None
    return "rest", None


def profile(preset, recipe, rounds, tmp):
    data = os.path.join(tmp, f"{preset}-{recipe}.data")
    subprocess.run(["perf", "record", "-q", "-F", str(FREQ), "--call-graph", "dwarf,16384",
                    "-o", data, os.path.join(ROOT, "target/release/bench"), "step",
                    "--preset", preset, "--recipes", recipe, "--threads", "1",
                    "--warmup", "1", "--rounds", str(rounds)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = subprocess.run(["perf", "script", "-i", data, "-F", "tid,ip,sym,srcline"],
                          check=True, capture_output=True, text=True).stdout
    os.remove(data)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="small,base")
    ap.add_argument("--recipes", default="fp32,bf16,nvfp4,mxfp8")
    ap.add_argument("--by-role", action="store_true", help="split each GEMM role into its parts")
    args = ap.parse_args()
    ranges = linear_ranges()
    cols = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            rounds = 12 if preset == "small" else 3
            for recipe in args.recipes.split(","):
                print(f"profiling {preset} {recipe} ...", file=sys.stderr)
                c, tot = collections.Counter(), 0
                for fr in samples(profile(preset, recipe, rounds, tmp)):
                    if not any("train_step" in f[0] for f in fr):
                        continue
                    tot += 1
                    top, part = classify(fr, ranges)
                    c[top] += 1
                    if part:
                        c["  " + part] += 1
                        c[top + ": " + part] += 1
                cols[f"{preset} {recipe}"] = (c, tot, rounds + 1)
    roles = ["GEMM Fprop", "GEMM Dgrad", "GEMM Wgrad"]
    rows = roles + ["  " + p for p in PARTS] + [name for _, name in OPS] + ["rest"]
    if args.by_role:
        rows += [f"{r}: {p}" for r in roles for p in PARTS
                 if any(c[f"{r}: {p}"] for c, _, _ in cols.values())]
    print("| % of step samples | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for row in rows:
        label = "GEMMs: " + row.strip() if row.startswith("  ") else row
        print(f"| {label} | " + " | ".join(f"{100 * c[row] / max(t, 1):.0f}"
                                           for c, t, _ in cols.values()) + " |")
    print("| sampled ms per step | " + " | ".join(f"{1e3 * t / FREQ / steps:.0f}"
                                                 for _, t, steps in cols.values()) + " |")


if __name__ == "__main__":
    main()
