"""fsdp-train's P-EAGLE draft and step against SpecForge 0.2.0's own (PEagleTrainStrategy,
OnlinePEagleModel, compute_peagle_metrics), on the cases tests/e2e/specforge_peagle_ref.py writes
from SpecForge's code: the same weights, features and sampled rows through tests/tools/peagle_step.
Compared: the loss, each sample's weighted loss numerator / denominator, the per-depth accuracy
counts (SpecForge's position_<d>_acc_sum/_total), every parameter's gradient (mask_hidden and the
embedding included) within 1e-6 relative to the tensor's largest value (SpecForge computes its
norms in float32 and keeps float32 RoPE tables and target distribution even on float64 inputs,
which bounds the agreement near 1e-7), and that fsdp-train's depth sampling draws SpecForge's rows
from the same seed. The packed case ("documents") is not compared: fsdp-train refuses packing for
P-EAGLE (SpecForge numbers a packed document's positions from the pack's start, unlike an engine).
A control changes mask_hidden and must move the loss. Usage: specforge_peagle.py TOOL WORKDIR
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import specforge_peagle_ref as ref  # noqa: E402

TOOL, WORK = sys.argv[1], sys.argv[2]
CASES = ["layers1", "layers2", "padded", "depths4"]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def run(name, cfg, weights, inputs):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(weights, os.path.join(d, "weights.safetensors"))
    save_file(inputs, os.path.join(d, "inputs.safetensors"))
    p = cfg["peagle"]
    opts = f'{p["num_depths"]} {p["down_sample_ratio"]} {p["down_sample_ratio_min"]} {p["seed"]}'
    subprocess.run([TOOL, d, os.path.join(d, "ours.safetensors"), opts], check=True)
    return load_file(os.path.join(d, "ours.safetensors"))


ok = True
for name in CASES:
    cfg, weights, inputs, exp = ref.build_case(name)
    ours = run(name, cfg, weights, inputs)
    worst = {"loss": rel(ours["loss"], exp["loss"]),
             "loss_num/den": rel(ours["sample_loss"], exp["loss_num"] / exp["loss_den"]),
             "weight": rel(ours["sample_weight"], exp["loss_den"])}
    counts_equal = True
    for dd in range(cfg["peagle"]["num_depths"]):
        tot, hit = exp[f"metric.position_{dd}_acc_total"], exp[f"metric.position_{dd}_acc_sum"]
        counts_equal &= ours["depth_total"][dd].item() == tot.item()
        counts_equal &= ours["depth_correct"][dd].item() == hit.item()
    grads = [k for k in exp if k.startswith("grad.") and k != "grad.logits"]
    missing = [k for k in grads if k not in ours]
    worst["grads"] = max(rel(ours[k], exp[k]) for k in grads if k in ours)
    same_rows = int(ours["cod.same"][0]) == 1
    passed = (max(worst.values()) < 1e-6 and counts_equal and not missing and same_rows
              and len(grads) > 8)
    print(f"{name}: rows {inputs['cod.depth'].numel()} depths {int(inputs['cod.depth'].max()) + 1} "
          f"worst {json.dumps({k: float(f'{v:.3e}') for k, v in worst.items()})} "
          f"counts_equal {counts_equal} same_rows {same_rows} missing {missing} "
          f"-> {'PASS' if passed else 'FAIL'}")
    ok &= passed

# Control: another mask_hidden moves SpecForge's loss; ours on the first weights must not match it.
cfg, weights, inputs, exp = ref.build_case("layers1", mask_hidden_delta=0.5)
ours = load_file(os.path.join(WORK, "layers1", "ours.safetensors"))
diff = rel(ours["loss"], exp["loss"])
print(f"control: mask_hidden + 0.5 moves the loss by {diff:.3e} relative")
ok &= diff > 1e-4
sys.exit(0 if ok else 1)
