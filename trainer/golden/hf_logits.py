#!/usr/bin/env python3
"""Logits of Nibble's exported tiny model, computed by Hugging Face transformers.

Run offline (never in CI), from the workspace root, in a venv holding exactly
trainer/golden/requirements.txt:

    python3 -m venv .venv-hf && .venv-hf/bin/pip install -r trainer/golden/requirements.txt
    .venv-hf/bin/python trainer/golden/hf_logits.py \
        --model trainer/tests/data/hf/tiny --nvfp4-model trainer/tests/data/hf/tiny-nvfp4-ct \
        --out trainer/tests/data/hf/logits.safetensors

It loads the folder written by `trainer::hf::export_model` with AutoModelForCausalLM and
AutoTokenizer (nothing Nibble-specific), tokenizes fixed prompts, checks that the tokens are
the UTF-8 bytes and that decoding gives the prompt back, and records the FP32 logits (eager
attention), and the same for the NVFP4 export (compressed-tensors layout), which
transformers decompresses with compressed-tensors. trainer/tests/hf_export.rs compares Nibble's FP32 forward pass with them.
"""

import argparse
import json

import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "Once, there was an angry hunter",
    'the fox that "we" follow (naps)',
    "caf\u00e9 \u00fcber na\u00efve \u2014 ok?",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--nvfp4-model", help="the compressed-tensors NVFP4 export of --model")
    a = ap.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cases = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        assert ids == list(p.encode("utf-8")), (p, ids)
        assert tok.decode(ids) == p, tok.decode(ids)
        assert len(ids) <= model.config.max_position_embeddings
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=False).logits[0]
        assert out.dtype == torch.float32
        cases.append((p, ids, out.contiguous()))
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    # One F32 tensor `logits.{i}` of shape [len(ids), vocab] per prompt; the prompts, their
    # token ids and the versions in the metadata.
    meta = {
        "versions": json.dumps(versions, sort_keys=True),
        "cases": json.dumps([{"prompt": p, "ids": ids} for p, ids, _ in cases]),
    }
    tensors = {f"logits.{i}": c[2] for i, c in enumerate(cases)}
    # The NVFP4 export (compressed-tensors layout), decompressed by compressed-tensors
    # inside transformers and run in FP32.
    if a.nvfp4_model:
        from transformers import CompressedTensorsConfig

        q = AutoModelForCausalLM.from_pretrained(
            a.nvfp4_model,
            dtype=torch.float32,
            attn_implementation="eager",
            quantization_config=CompressedTensorsConfig(run_compressed=False),
        )
        q.eval()
        for i, (p, ids, _) in enumerate(cases):
            with torch.no_grad():
                tensors[f"nvfp4_ct_logits.{i}"] = q(torch.tensor([ids]), use_cache=False).logits[0].contiguous()
        import compressed_tensors

        versions["compressed-tensors"] = compressed_tensors.__version__
        meta["versions"] = json.dumps(versions, sort_keys=True)
    save_file(tensors, a.out, metadata=meta)
    print(versions, [len(c[1]) for c in cases])


if __name__ == "__main__":
    main()
