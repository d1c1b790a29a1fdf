#!/usr/bin/env python3
"""Golden checkpoints for fp_formats::checkpoint, from the real producer libraries.

Run offline (never in CI), from the workspace root, in a venv holding exactly
fp-formats/golden/requirements.txt:

    python3 -m venv .venv-ckpt && .venv-ckpt/bin/pip install -r fp-formats/golden/requirements.txt
    .venv-ckpt/bin/python fp-formats/golden/make_checkpoint_golden.py --out fp-formats/tests/data/checkpoint

It
1. writes `input.safetensors`: a small deterministic Llama-named weight set (F32, BF16 and
   F16 linear weights with edge-case blocks, plus an embedding, an LM head and norms);
2. quantizes every linear weight (widened to float32) with the libraries themselves:
   compressed-tensors' NVFP4A16 scheme (`generate_gparam`, `calculate_qparams`,
   `NVFP4PackedCompressor.compress`) -> `ct_nvfp4.safetensors`; its MXFP8A16 scheme
   (`MXFP8QuantizationCompressor.compress`) -> `ct_mxfp8.safetensors`; ModelOpt's
   `NVFP4QTensor.quantize(w, 16)` -> `modelopt_nvfp4.safetensors`;
3. runs Nibble's CLI (`cargo run --example quantize_checkpoint`) on the same input in four
   configurations and decompresses Nibble's output with the libraries' own loaders:
   compressed-tensors validates Nibble's `quantization_config` (`QuantizationConfig`) and
   decompresses with the scheme it parsed -> `ct_nvfp4_decompressed.safetensors` (BF16),
   `ct_mxfp8_rceil_decompressed.safetensors` (Nibble's default RCEIL scales);
   ModelOpt's `NVFP4QTensor.dequantize` -> `modelopt_nvfp4_dequantized.safetensors` (F32);
4. writes `versions.json`.

fp-formats/tests/checkpoint_golden.rs compares Nibble's bytes with these files bit for bit.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

import torch
from safetensors.torch import load_file, save_file

warnings.filterwarnings("ignore")

LINEAR = {
    # name: (rows, cols, dtype)
    "model.layers.0.mlp.up_proj.weight": (48, 128, torch.float32),
    "model.layers.0.self_attn.q_proj.weight": (32, 64, torch.bfloat16),
    "model.layers.0.self_attn.o_proj.weight": (16, 96, torch.float16),
}
OTHER = {
    "model.embed_tokens.weight": ((40, 32), torch.float32),
    "lm_head.weight": ((40, 32), torch.float32),
    "model.norm.weight": ((32,), torch.float32),
    "model.layers.0.input_layernorm.weight": ((32,), torch.bfloat16),
}


class Lcg:
    """64-bit LCG (Knuth MMIX); uniform in [0, 1) from the top 53 bits."""

    def __init__(self, seed):
        self.s = seed & (2**64 - 1)

    def uniform(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        return (self.s >> 11) / float(2**53)

    def normal(self):
        u1 = max(self.uniform(), 1e-300)
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def make_weight(seed, rows, cols):
    r = Lcg(seed)
    w = [[0.02 * (1 + (i % 5)) / 3 * r.normal() for _ in range(cols)] for i in range(rows)]
    # Outliers.
    for k in range(rows // 4):
        i, j = int(r.uniform() * rows), int(r.uniform() * cols)
        w[i][j] = (r.uniform() - 0.5) * 0.8
    # Row 0: an all-zero block (with -0.0), a block of tiny values whose NVFP4 scale
    # underflows E4M3, a block of negatives far below its maximum (codes -0 / 0x8).
    for j in range(16):
        w[0][j] = -0.0 if j % 3 == 0 else 0.0
        w[0][16 + j] = (j - 7.5) * 1e-9
        w[0][32 + j] = -1e-4 * (j + 1)
    w[0][47] = 0.05
    # Row 1: block maxima with significand exactly 1.75 (MX scale rules differ there) and
    # values on E2M1 ties after scaling.
    if cols >= 64:
        for j in range(32):
            w[1][j] = 0.4375 * (1 if j == 5 else (j - 16) / 40.0)
        for j in range(32, 48):
            w[1][j] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0][j % 8] * (-1) ** j / 6.0 * 0.3
    # Row 2: a whole MX block of zeros.
    for j in range(32):
        w[2][j] = 0.0
    return torch.tensor(w, dtype=torch.float32)


def make_input():
    tensors = {}
    for seed, (name, (rows, cols, dtype)) in enumerate(LINEAR.items()):
        tensors[name] = make_weight(1000 + seed, rows, cols).to(dtype)
    for seed, (name, (shape, dtype)) in enumerate(OTHER.items()):
        r = Lcg(7 + seed)
        n = math.prod(shape)
        v = torch.tensor([1.0 + 0.1 * r.normal() for _ in range(n)], dtype=torch.float32)
        tensors[name] = v.reshape(shape).to(dtype)
    return tensors


def ct_nvfp4(w):
    from compressed_tensors.compressors import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4A16
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    scheme = QuantizationScheme(targets=["Linear"], **NVFP4A16)
    args = scheme.weights
    rows, cols = w.shape
    gs = generate_gparam(w.min(), w.max())
    g = w.reshape(rows, cols // 16, 16)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args, global_scale=gs)
    state = {
        "weight": w,
        "weight_scale": scale,
        "weight_global_scale": gs,
        "weight_zero_point": zp,
    }
    return NVFP4PackedCompressor.compress(state, scheme)


def ct_mxfp8(w):
    from compressed_tensors.compressors import MXFP8QuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP8A16
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = QuantizationScheme(targets=["Linear"], **MXFP8A16)
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    return MXFP8QuantizationCompressor.compress(state, scheme)


def modelopt_nvfp4(w):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    q, scale, scale_2 = NVFP4QTensor.quantize(w.clone(), 16)
    return {"weight": q._quantized_data, "weight_scale": scale, "weight_scale_2": scale_2}


def run_nibble(root, inp, out, *args):
    cmd = [
        "cargo", "run", "--quiet", "--release", "-p", "fp-formats", "--features", "checkpoint",
        "--example", "quantize_checkpoint", "--", "quantize", inp, "--out", out, "--no-stats", *args,
    ]
    subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)


def ct_decompress(nibble_dir, compressor):
    from compressed_tensors.quantization import QuantizationConfig

    cfg = json.load(open(os.path.join(nibble_dir, "config.json")))["quantization_config"]
    qc = QuantizationConfig.model_validate(cfg)
    scheme = qc.config_groups["group_0"]
    sd = load_file(os.path.join(nibble_dir, "input.safetensors"))
    out = {}
    for name in LINEAR:
        p = name[: -len(".weight")]
        local = {k[len(p) + 1 :]: v for k, v in sd.items() if k.startswith(p + ".weight")}
        out[name] = compressor.decompress(local, scheme)["weight"].contiguous()
    return out


def modelopt_dequantize(nibble_dir):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    sd = load_file(os.path.join(nibble_dir, "input.safetensors"))
    out = {}
    for name, (rows, cols, _) in LINEAR.items():
        p = name[: -len(".weight")]
        q = NVFP4QTensor(torch.Size([rows, cols]), torch.float32, sd[f"{p}.weight"])
        out[name] = q.dequantize(
            dtype=torch.float32,
            scale=sd[f"{p}.weight_scale"],
            double_scale=sd[f"{p}.weight_scale_2"],
            block_sizes={-1: 16},
        ).contiguous()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(a.out, exist_ok=True)
    inp = os.path.join(a.out, "input.safetensors")
    tensors = make_input()
    save_file(tensors, inp, metadata={"format": "pt"})

    ct4, ct8, mo = {}, {}, {}
    for name in LINEAR:
        p = name[: -len(".weight")]
        w = tensors[name].float()
        for k, v in ct_nvfp4(w).items():
            ct4[f"{p}.{k}"] = v.contiguous()
        for k, v in ct_mxfp8(w).items():
            ct8[f"{p}.{k}"] = v.contiguous()
        for k, v in modelopt_nvfp4(w).items():
            mo[f"{p}.{k}"] = v.contiguous()
    save_file(ct4, os.path.join(a.out, "ct_nvfp4.safetensors"))
    save_file(ct8, os.path.join(a.out, "ct_mxfp8.safetensors"))
    save_file(mo, os.path.join(a.out, "modelopt_nvfp4.safetensors"))

    from compressed_tensors.compressors import MXFP8QuantizationCompressor, NVFP4PackedCompressor

    with tempfile.TemporaryDirectory() as tmp:
        d4 = os.path.join(tmp, "ct4")
        run_nibble(root, inp, d4, "--layout", "compressed-tensors")
        save_file(
            ct_decompress(d4, NVFP4PackedCompressor),
            os.path.join(a.out, "ct_nvfp4_decompressed.safetensors"),
        )
        d8 = os.path.join(tmp, "ct8")
        run_nibble(root, inp, d8, "--scheme", "mxfp8", "--layout", "compressed-tensors")
        save_file(
            ct_decompress(d8, MXFP8QuantizationCompressor),
            os.path.join(a.out, "ct_mxfp8_rceil_decompressed.safetensors"),
        )
        dm = os.path.join(tmp, "mo")
        run_nibble(root, inp, dm)
        save_file(modelopt_dequantize(dm), os.path.join(a.out, "modelopt_nvfp4_dequantized.safetensors"))

    import compressed_tensors
    import modelopt
    import safetensors

    versions = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "compressed-tensors": compressed_tensors.__version__,
        "nvidia-modelopt": modelopt.__version__,
        "safetensors": safetensors.__version__,
    }
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(versions))


if __name__ == "__main__":
    main()
