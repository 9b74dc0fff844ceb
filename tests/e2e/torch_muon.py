"""fsdp-train's Muon step (lib/optim/muon.h, through tests/tools/muon_step) against torch.optim.Muon
of the PyTorch the project pins (2.11): the same fp32 matrices (wide, tall, square) and
gradients over three steps, for Nesterov and plain momentum, both learning-rate adjustments and
a weight decay; every parameter and momentum buffer within 1e-6 relative (the same bfloat16
Newton-Schulz on the same CPU kernels: expected bitwise). A control with five Newton-Schulz steps
on one side and four on the other must differ. Usage: torch_muon.py MUON_STEP WORKDIR
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

TOOL, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
SHAPES = [(8, 16), (24, 8), (12, 12)]
STEPS = 3


def case(name, lr, momentum, nesterov, wd, ns_steps, adjust, tool_ns_steps=None):
    g = torch.Generator().manual_seed(len(name))
    params = [torch.randn(s, generator=g) for s in SHAPES]
    grads = [[torch.randn(s, generator=g) * 0.1 for s in SHAPES] for _ in range(STEPS)]
    inputs = {f"param.{k}": p.clone() for k, p in enumerate(params)}
    for s in range(STEPS):
        for k in range(len(SHAPES)):
            inputs[f"grad.{k}.{s}"] = grads[s][k]
    path_in, path_out = os.path.join(WORK, f"{name}.in"), os.path.join(WORK, f"{name}.out")
    save_file(inputs, path_in)
    ref = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Muon(ref, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd,
                           ns_steps=ns_steps, adjust_lr_fn=adjust)
    for s in range(STEPS):
        for p, gr in zip(ref, grads[s]):
            p.grad = gr.clone()
        opt.step()
    opts = f"{lr} {momentum} {int(nesterov)} {wd} {tool_ns_steps or ns_steps} {adjust}"
    subprocess.run([TOOL, path_in, path_out, opts], check=True)
    ours = load_file(path_out)
    worst = 0.0
    for k, p in enumerate(ref):
        for got, want in ((ours[f"param.{k}"], p.detach()),
                          (ours[f"momentum.{k}"], opt.state[p]["momentum_buffer"])):
            worst = max(worst, ((got - want).norm() / want.norm()).item())
    return worst


ok = True
for args in [("nesterov_rms", 0.02, 0.95, True, 0.1, 5, "match_rms_adamw"),
             ("plain_original", 0.05, 0.9, False, 0.0, 5, "original"),
             ("nesterov_original_wd", 0.01, 0.95, True, 0.2, 3, "original")]:
    worst = case(*args)
    passed = worst <= 1e-6
    ok &= passed
    print(f"{args[0]}: worst relative difference {worst:.3e} -> {'PASS' if passed else 'FAIL'}")
ctrl = case("control", 0.02, 0.95, True, 0.1, 5, "match_rms_adamw", tool_ns_steps=4)
print(f"control: 4 Newton-Schulz steps against 5 differ by {ctrl:.3e}")
ok &= ctrl > 1e-4
sys.exit(0 if ok else 1)
