#!/usr/bin/env python3
"""Produce optim/tests/data/torch_reference.json: PyTorch reference values for the optim crate.

A small deterministic problem (four parameters in two groups, five steps with given gradients and a
varying learning rate) is run through torch.optim.AdamW (with and without
torch.nn.utils.clip_grad_norm_) and torch.optim.SGD (momentum with dampening, and Nesterov). After each
step the parameters, the optimizer state and (with clipping) the pre-clip norm are recorded.

Choices that make the reference usable bit for bit:
  * every hyperparameter and learning rate is an f32 value (the Rust API takes f32); Python then
    computes the scalar coefficients (1 - lr*wd, 1 - beta^t, ...) in f64 from the same values the
    Rust code sees, and rounds them to f32 exactly where PyTorch does;
  * ATEN_CPU_CAPABILITY=default selects PyTorch's portable kernels, which do no fused multiply-add
    (the AVX2/AVX-512 kernels fuse some of them and differ by an ulp here and there);
  * foreach=False selects the single-tensor implementation (_single_tensor_adam / _single_tensor_sgd).

PyTorch's f32 sqrt on CPU is not correctly rounded (about 1 input in 5 is 1 ulp off, even with the
default capability), while the Rust crate uses IEEE sqrt, so AdamW parameters can differ by an ulp.
check_adamw_formula() below replays the unclipped AdamW run in numpy with the crate's formula and
PyTorch's sqrt, and asserts that this reproduces PyTorch bit for bit: the formula is exact, sqrt is the
only difference. SGD has no sqrt and is reproduced bit for bit by the crate.

Usage (from the repository root, with a Python that has torch and numpy; torch from PyPI is fine):
    python optim/tests/data/make_adamw_reference.py
"""
import json
import os
import sys

os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")

import numpy as np  # noqa: E402
import torch  # noqa: E402

SIZES = [7, 15, 4, 9]
GROUP_OF = [0, 0, 1, 1]
STEPS = 5
LRS = [1e-2, 2e-2, 3e-2, 2.5e-2, 1e-2]
GROUPS = [  # (weight_decay, lr_scale)
    (0.1, 1.0),
    (0.0, 0.5),
]
ADAMW = dict(beta1=0.9, beta2=0.95, eps=1e-8)
MAX_NORM = 1.0
SGD_CASES = {
    "sgd_momentum": dict(momentum=0.9, dampening=0.1, nesterov=False),
    "sgd_nesterov": dict(momentum=0.9, dampening=0.0, nesterov=True),
}
SGD_GROUPS = [(0.01, 1.0), (0.0, 0.5)]


def f32(x):
    """The f32 value nearest to x, as a Python float (exactly what the Rust side holds)."""
    return float(np.float32(x))


def problem():
    rng = np.random.default_rng(20240601)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    # Gradient scale varies per step so that clipping at MAX_NORM is active on some steps only.
    scales = [0.1, 0.6, 0.05, 0.4, 0.2]
    grads = [[(rng.standard_normal(n) * s).astype(np.float32) for n in SIZES] for s in scales]
    return params, grads


def tensors(arrays):
    return [torch.tensor(a.copy(), dtype=torch.float32) for a in arrays]


def groups_for(ps, groups):
    out = []
    for gid, (wd, scale) in enumerate(groups):
        members = [p for p, g in zip(ps, GROUP_OF) if g == gid]
        out.append({"params": members, "weight_decay": f32(wd), "lr": f32(LRS[0]) * f32(scale)})
    return out


def set_lrs(opt, lr, groups):
    for group, (_, scale) in zip(opt.param_groups, groups):
        # The Rust side computes the group lr as an f32 product.
        group["lr"] = float(np.float32(lr) * np.float32(scale))


def lst(t):
    return [float(x) for x in t.detach().numpy().astype(np.float32)]


def run_adamw(params0, grads, clip):
    ps = [torch.nn.Parameter(t) for t in tensors(params0)]
    opt = torch.optim.AdamW(
        groups_for(ps, GROUPS),
        betas=(f32(ADAMW["beta1"]), f32(ADAMW["beta2"])),
        eps=f32(ADAMW["eps"]),
        foreach=False,
        fused=False,
    )
    steps = []
    for t in range(STEPS):
        for p, g in zip(ps, tensors(grads[t])):
            p.grad = g
        rec = {"lr": f32(LRS[t])}
        if clip:
            norm = torch.nn.utils.clip_grad_norm_(ps, f32(MAX_NORM), foreach=False)
            rec["grad_norm"] = float(norm)
        set_lrs(opt, f32(LRS[t]), GROUPS)
        opt.step()
        rec["params"] = [lst(p) for p in ps]
        rec["exp_avg"] = [lst(opt.state[p]["exp_avg"]) for p in ps]
        rec["exp_avg_sq"] = [lst(opt.state[p]["exp_avg_sq"]) for p in ps]
        steps.append(rec)
    return steps


def run_sgd(params0, grads, momentum, dampening, nesterov):
    ps = [torch.nn.Parameter(t) for t in tensors(params0)]
    opt = torch.optim.SGD(
        groups_for(ps, SGD_GROUPS),
        momentum=f32(momentum),
        dampening=f32(dampening),
        nesterov=nesterov,
        foreach=False,
    )
    steps = []
    for t in range(STEPS):
        for p, g in zip(ps, tensors(grads[t])):
            p.grad = g
        set_lrs(opt, f32(LRS[t]), SGD_GROUPS)
        opt.step()
        steps.append(
            {
                "lr": f32(LRS[t]),
                "params": [lst(p) for p in ps],
                "momentum_buffer": [lst(opt.state[p]["momentum_buffer"]) for p in ps],
            }
        )
    return steps


def check_adamw_formula(params0, grads, steps):
    """Replays run_adamw(clip=False) with the optim crate's element-wise formula (numpy f32) and
    torch's sqrt; asserts bit equality. Returns how many updates IEEE sqrt would change."""
    f = np.float32
    b1, b2, eps = f32(ADAMW["beta1"]), f32(ADAMW["beta2"]), f(ADAMW["eps"])
    sqrt_differs = 0
    for i, p in enumerate(params0):
        wd, scale = (f32(x) for x in GROUPS[GROUP_OF[i]])
        p = p.copy()
        m = np.zeros_like(p)
        v = np.zeros_like(p)
        for t in range(STEPS):
            g = grads[t][i]
            lr = float(f(LRS[t]) * f(scale))
            p = p * f(1 - lr * wd)
            m = m + f(1 - b1) * (g - m)  # PyTorch's lerp for a weight < 0.5
            v = v * f(b2) + f(1 - b2) * g * g
            step_size = lr / (1 - b1 ** (t + 1))
            bc2_sqrt = (1 - b2 ** (t + 1)) ** 0.5
            torch_sqrt = torch.tensor(v).sqrt().numpy()
            sqrt_differs += int(np.sum(torch_sqrt != np.sqrt(v)))
            p = p + (f(-step_size) * m) / (torch_sqrt / f(bc2_sqrt) + eps)
            want = np.array(steps[t]["params"][i], dtype=f)
            assert np.array_equal(p, want), f"formula mismatch at step {t}, param {i}"
    return sqrt_differs


def main():
    params0, grads = problem()
    out = {
        "generator": "optim/tests/data/make_adamw_reference.py",
        "torch_version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "sizes": SIZES,
        "group_of": GROUP_OF,
        "init_params": [[float(x) for x in p] for p in params0],
        "grads": [[[float(x) for x in g] for g in step] for step in grads],
        "adamw": {
            "beta1": f32(ADAMW["beta1"]),
            "beta2": f32(ADAMW["beta2"]),
            "eps": f32(ADAMW["eps"]),
            "groups": [[f32(wd), f32(s)] for wd, s in GROUPS],
            "max_norm": f32(MAX_NORM),
            "noclip": run_adamw(params0, grads, clip=False),
            "clip": run_adamw(params0, grads, clip=True),
        },
        "sgd": {
            "groups": [[f32(wd), f32(s)] for wd, s in SGD_GROUPS],
            **{
                name: {
                    "momentum": f32(c["momentum"]),
                    "dampening": f32(c["dampening"]),
                    "nesterov": c["nesterov"],
                    "steps": run_sgd(params0, grads, **c),
                }
                for name, c in SGD_CASES.items()
            },
        },
    }
    sqrt_differs = check_adamw_formula(params0, grads, out["adamw"]["noclip"])
    print(f"AdamW formula check passed; torch sqrt differs from IEEE sqrt in {sqrt_differs} updates")
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "torch_reference.json"
    )
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} (torch {torch.__version__}, cpu capability {out['cpu_capability']})")


if __name__ == "__main__":
    main()
