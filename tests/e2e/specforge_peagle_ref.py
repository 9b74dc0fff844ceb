"""P-EAGLE reference cases from SpecForge 0.2.0's own code (PyPI specforge, installed without its
dependencies by launch/setup.sh), for checking a C++ implementation against. Every case goes through
the path SpecForge's trainer takes for a P-EAGLE step: PEagleTrainStrategy.forward_loss on a
TrainBatch as the streaming consumer gets it (aux hidden states, the target's last hidden state
and a frozen TargetHead, target_repr "hidden_state"), OnlinePEagleModel (COD sampling, the
flex-attention mask, the draft forward) and compute_peagle_metrics, in float64, then backward.

Two stand-ins, both for things that cannot run on a CPU, both checked: SpecForge's LogSoftmaxLoss
is a Triton kernel (CUDA only, float32) and is replaced in specforge.algorithms.peagle.model by
_LogSoftmaxLoss64 (the kernel's formula in float64), checked against SpecForge's own torch
reference of it (specforge.core.loss._compute_loss, float32); and torch refuses flex_attention
backward on CPU by a device check only (_validate_device), which is skipped, so the eager (dense)
flex_attention runs forward and backward. SpecForge's LlamaRMSNorm computes in float32 and its
RoPE tables are float32 values, which bounds float64 agreement near 1e-7.

COD RNG (generate_cod_sample_indices): the only random calls of a step are
torch.randperm(n_eligible, device=loss_mask.device), one per depth d = 1, 2, ... in order, and only
at depths where n_eligible > sample_size (else every eligible position is taken, no call); the
first sample_size entries are kept and sorted. On CPU this draws from the default CPU generator,
here seeded by torch.manual_seed(seed) right before the step (on CUDA, SpecForge draws from the
CUDA generator instead). The calls are recorded (cod.randperm_n).

Usage: specforge_peagle_ref.py WORKDIR   (module: build_case(name) -> config, weights, inputs,
expected; self_check(...) -> list of failures)
"""
import json
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SpecForge's RMSNorm/RoPE are torch.compile'd

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.attention.flex_attention as _flex  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.llama.configuration_llama import LlamaConfig  # noqa: E402

import specforge.algorithms.peagle.model as PM  # noqa: E402
from specforge.core.loss import _compute_loss  # noqa: E402
from specforge.modeling.draft.peagle import PEagleDraftModel  # noqa: E402
from specforge.modeling.target.target_head import TargetHead  # noqa: E402
from specforge.runtime.contracts import TrainBatch  # noqa: E402
from specforge.training.model_utils import resolve_mask_token_id  # noqa: E402
from specforge.training.strategies.base import PEagleTrainStrategy  # noqa: E402

_flex._validate_device = lambda *a: None  # eager flex_attention backward works on CPU (checked)
S, V, VD, HT, MASK, SEED = 24, 64, 24, 20, 63, 1234
# SpecForge's config schema (YAML) defaults; OnlinePEagleModel's own default ratio is 0.7.
DEFAULTS = dict(num_depths=8, down_sample_ratio=0.8, down_sample_ratio_min=0.2)
CASES = {
    "layers1": dict(layers=1),
    "layers2": dict(layers=2),
    "documents": dict(layers=2, lengths=[10, 9], pad=5),  # packed: explicit lengths + padding
    "padded": dict(layers=1, pad=6),  # no lengths: SpecForge derives [attention_mask.sum()]
    "depths4": dict(layers=2, num_depths=4, down_sample_ratio=0.5),
}


def config(layers):
    return {
        "architectures": ["PEagleDraftModel"], "model_type": "llama",
        "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": layers,
        "vocab_size": V, "draft_vocab_size": VD, "target_hidden_size": HT,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "rope_scaling": None, "hidden_act": "silu", "tie_word_embeddings": False,
        "norm_before_residual": False, "mask_token_id": MASK,
    }


class _LogSoftmaxLoss64:
    """float64 stand-in for SpecForge's Triton LogSoftmaxLoss: per row -sum_v p_v log_softmax(z)_v,
    0 where the row's mask is 0 (the kernel reads the mask as a bool), mean over all B*T rows. Its
    autograd gradient is the kernel's backward, -(p - softmax(z) sum p) g / (B*T) on kept rows."""
    seen = {}

    @staticmethod
    def apply(logits, target_p, position_mask):
        _LogSoftmaxLoss64.seen.update(target_p=target_p.detach(), mask=position_mask.detach())
        row = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)
        return torch.where(position_mask.squeeze(-1).bool(), row, torch.zeros_like(row)).mean()


def features(spec, gen, head_w, agree):
    """One streamed P-EAGLE sample: what the server capture hands the consumer (batch size 1)."""
    pad, lengths = spec.get("pad", 0), spec.get("lengths")
    ids = torch.randint(0, V - 1, (1, S), generator=gen)  # V-1 = MASK never appears as a token
    attn = torch.ones(1, S, dtype=torch.long)
    loss = torch.ones(1, S, dtype=torch.long)
    loss[0, :4] = 0  # a prompt
    loss[0, 11:13] = 0  # a gap (a tool call, say)
    if lengths:
        loss[0, lengths[0]:lengths[0] + 3] = 0  # the second document's prompt
    if pad:
        ids[0, S - pad:] = 0
        attn[0, S - pad:] = 0
        loss[0, S - pad:] = 0
    aux = torch.randn(1, S, 3 * HT, generator=gen, dtype=torch.float64)
    last = torch.randn(1, S, HT, generator=gen, dtype=torch.float64)
    for p, tid in agree.items():  # the teacher at p (the head on last[p+1]) gets top-1 tid
        last[0, p + 1] = head_w[tid] * 3.0
    t = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss, "hidden_state": aux,
         "target": last}
    if lengths:
        t["lengths"] = torch.tensor(lengths, dtype=torch.long)
    return t


def build_case(name, mask_hidden_delta=0.0):
    """Runs one case through SpecForge; returns (config, weights, inputs, expected) dicts.
    Teacher top-1s the draft gets right, so the accuracies count hits: from a first pass, at
    positions p % 3 == 0 the depth-0 row's argmax and at p % 3 == 1 the deepest row's become the
    teacher's top-1 there (the sampling does not read the teacher; the control keeps them)."""
    _, weights, inputs, exp = _run(name, 0.0, {})
    pos, depth = inputs["cod.anchor_pos"] + inputs["cod.depth"], inputs["cod.depth"]
    ids, pred = weights["t2d"].nonzero().squeeze(-1), exp["logits"][0].argmax(-1)
    agree = {int(p): int(ids[j]) for p, d, j in zip(pos, depth, pred)
             if p < S - 1 and (p % 3 == 0 and d == 0 or p % 3 == 1)}  # deeper rows come later
    return _run(name, mask_hidden_delta, agree)


def _run(name, mask_hidden_delta, agree):
    spec = {**DEFAULTS, **CASES[name]}
    cfg = config(spec["layers"])
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    draft = PEagleDraftModel(LlamaConfig(**cfg)).double()
    with torch.no_grad():
        for pname, p in draft.named_parameters():
            if "norm" in pname:
                p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64) + 0.5)
            else:
                p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) - 0.5) * 0.5)
        draft.mask_hidden.copy_(torch.randn(draft.mask_hidden.shape, generator=gen,
                                            dtype=torch.float64) + mask_hidden_delta)
        # Draft vocabulary: 24 target ids, token 0 among them; t2d marks them, d2t[j] = id_j - j.
        ids = torch.cat([torch.zeros(1, dtype=torch.long),
                         1 + torch.randperm(V - 1, generator=gen)[:VD - 1]]).sort()[0]
        draft.t2d.zero_()
        draft.t2d[ids] = True
        draft.d2t.copy_(ids - torch.arange(VD))
    head = TargetHead.__new__(TargetHead)  # its __init__ reads a model directory's config
    nn.Module.__init__(head)
    head.fc = nn.Linear(HT, V, bias=False).double()
    with torch.no_grad():  # draft-vocabulary rows scaled up: most, not all, top-1s are drafted
        head.fc.weight.copy_(torch.randn(V, HT, generator=gen, dtype=torch.float64) * 0.5)
        head.fc.weight[ids] *= 1.3
    head.freeze_weights()
    mask_id = resolve_mask_token_id(explicit=cfg["mask_token_id"], tokenizer=None,
                                    draft_model=draft, embedding_vocab_size=V)
    model = PM.OnlinePEagleModel(draft, mask_token_id=mask_id,
                                 **{k: spec[k] for k in DEFAULTS})
    strategy = PEagleTrainStrategy(model, target_head=head)
    tensors = features(spec, gen, head.fc.weight.detach(), agree)
    batch = TrainBatch(sample_ids=[name], strategy="peagle", tensors=tensors,
                       metadata={"target_repr": "hidden_state"})

    seen, calls = {}, []
    real = (PM.generate_cod_sample_indices, PM.compute_peagle_metrics, PM.LogSoftmaxLoss,
            torch.randperm)

    def cod(*a, **k):
        seen["cod_kwargs"] = k
        seen["cod"] = real[0](*a, **k)
        return seen["cod"]

    def metrics(logits, targets, **k):
        logits.retain_grad()
        seen.update(logits=logits, teacher=targets.detach())
        return real[1](logits, targets, **k)

    def randperm(n, *a, **k):
        calls.append(n)
        return real[3](n, *a, **k)

    PM.generate_cod_sample_indices, PM.compute_peagle_metrics = cod, metrics
    PM.LogSoftmaxLoss, torch.randperm = _LogSoftmaxLoss64, randperm
    try:
        torch.manual_seed(SEED)
        out = strategy.forward_loss(batch)
        out.loss.backward()
    finally:
        (PM.generate_cod_sample_indices, PM.compute_peagle_metrics, PM.LogSoftmaxLoss,
         torch.randperm) = real

    anchor, depth = seen["cod"]
    lengths = seen["cod_kwargs"]["lengths"]
    q, kv = torch.arange(len(anchor))[:, None], torch.arange(len(anchor))[None, :]
    dense = PM.create_peagle_mask_mod(anchor, depth, lengths, S)(0, 0, q, kv)
    target_p, pmask = _LogSoftmaxLoss64.seen["target_p"], _LogSoftmaxLoss64.seen["mask"]
    row_ce = -(target_p * torch.log_softmax(seen["logits"].detach(), -1)).sum(-1)

    inputs = {k: v.contiguous() for k, v in tensors.items()}
    inputs["target_head.weight"] = head.fc.weight.detach().clone()
    inputs["lengths_used"] = lengths.clone()
    inputs["seed"] = torch.tensor([SEED])
    inputs["cod.anchor_pos"], inputs["cod.depth"] = anchor.clone(), depth.clone()
    inputs["cod.randperm_n"] = torch.tensor(calls, dtype=torch.long)
    for d in range(1, int(depth.max()) + 1):
        inputs[f"cod.sampled.d{d}"] = (anchor[depth == d] + d).clone()
    inputs["attn_mask"] = dense.to(torch.uint8)
    exp = {"loss": out.loss.detach().reshape(1),
           "loss_num": (row_ce * pmask.squeeze(-1)).sum().reshape(1),
           "loss_den": pmask.sum().reshape(1),
           "logits": seen["logits"].detach(), "grad.logits": seen["logits"].grad,
           "target_p": target_p, "sampled_loss_mask": pmask.squeeze(-1),
           "teacher_logits": seen["teacher"]}
    for k, v in out.metrics.items():
        exp["metric." + k] = torch.as_tensor(v, dtype=torch.float64).reshape(1)
    for k, p in draft.named_parameters():
        exp["grad." + k] = p.grad.detach()
    weights = {k: v.detach().contiguous() for k, v in draft.state_dict().items()}
    cfg = dict(cfg, peagle={**{k: spec[k] for k in DEFAULTS}, "seed": SEED,
                            "mask_token_id": mask_id, "lengths": spec.get("lengths"),
                            "note": "preprocess shifts input_ids and target left, not loss_mask"})
    return cfg, weights, inputs, {k: v.detach().clone().contiguous() for k, v in exp.items()}


def self_check(cfg, weights, inputs, exp):
    """Checks that can fail: the loss and accuracies recomputed in plain torch from the written
    tensors; the float64 loss stand-in against SpecForge's torch reference of its kernel."""
    bad = []
    anchor, depth = inputs["cod.anchor_pos"], inputs["cod.depth"]
    pos, t2d, logits = anchor + depth, weights["t2d"], exp["logits"][0]
    last = inputs["target"][0]
    shifted = torch.cat([last[1:], torch.zeros_like(last[:1])])  # TargetHead.preprocess's shift
    teacher = shifted @ inputs["target_head.weight"].T
    m = inputs["loss_mask"][0, pos].double() * t2d[teacher.argmax(-1)[pos]].double()
    p = torch.softmax(teacher[pos][:, t2d].float(), -1)  # SpecForge's target_p is float32
    ce = -(p * torch.log_softmax(logits, -1)).sum(-1)
    loss = (ce * m).mean() * (len(pos) / m.float().sum())  # SpecForge's T/den is a float32 tensor
    if abs(loss - exp["loss"][0]) > 1e-12 * abs(loss):
        bad.append(f"loss recomputed {loss.item():.15g} vs {exp['loss'][0].item():.15g}")
    if abs(m.sum() - exp["loss_den"][0]) > 0 or abs((ce * m).sum() - exp["loss_num"][0]) > 1e-12:
        bad.append("loss numerator/denominator")
    hit = (logits.argmax(-1) == p.argmax(-1)) & (m > 0.5)
    for d in range(cfg["peagle"]["num_depths"]):
        got = (exp[f"metric.position_{d}_acc_sum"][0], exp[f"metric.position_{d}_acc_total"][0])
        if got != (hit[depth == d].sum(), (m[depth == d] > 0.5).sum()):
            bad.append(f"depth {d} accuracy {got}")
    ref = _compute_loss(exp["logits"], exp["target_p"], exp["sampled_loss_mask"][..., None])
    ours = (ce * m).mean()
    if abs(ref.double() - ours) > 1e-6 * abs(ours):
        bad.append(f"stand-in {ours.item():.9g} vs SpecForge _compute_loss {ref.item():.9g}")
    torch.manual_seed(int(inputs["seed"][0]))  # positions follow from seed, loss mask, lengths
    opts = {k: cfg["peagle"][k] for k in DEFAULTS}
    again = PM.generate_cod_sample_indices(S, inputs["loss_mask"], lengths=inputs["lengths_used"],
                                           **opts)
    if not (torch.equal(again[0], anchor) and torch.equal(again[1], depth)):
        bad.append("COD positions not reproduced from the seed")
    zero = [k for k, g in exp.items() if k.startswith("grad.") and not g.abs().sum() > 0]
    if zero:
        bad.append(f"zero gradients: {zero}")
    return bad


README = """P-EAGLE reference cases from SpecForge 0.2.0 (tests/e2e/specforge_peagle_ref.py).
Each CASE/ has config.json (LlamaConfig fields + "peagle": num_depths, down_sample_ratio(_min),
seed, mask_token_id, lengths), weights.safetensors, inputs.safetensors, expected.safetensors.
S = 24 positions, V = 64, Vd = 24 (draft vocab), Ht = 20, H = 32, T = rows (S + sampled rows).
Scalars are stored with shape [1].
weights: PEagleDraftModel.state_dict() names: embed_tokens.weight [V,H], fc.weight [H,3Ht],
  mask_hidden [1,1,3Ht], layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
  layers.0.self_attn.{q,k,v}_proj.weight [*,2H], o_proj [H,H], layers.0.mlp.{gate,up,down}_proj,
  layers.i>0 as a standard layer (input_layernorm, self_attn [*,H], post_attention_layernorm, mlp),
  norm.weight [H], lm_head.weight [Vd,H], t2d [V] bool, d2t [Vd] int64 (target id = j + d2t[j]).
inputs: input_ids, attention_mask, loss_mask [1,S] int64 (unshifted, as streamed); hidden_state
  [1,S,3Ht] (aux layers); target [1,S,Ht] (target's last hidden state, unshifted);
  target_head.weight [V,Ht]; lengths [ndocs] (only in packed cases); lengths_used (what COD and the
  mask used: lengths, else [attention_mask.sum()]); seed [1] (torch.manual_seed before the step);
  cod.anchor_pos [T], cod.depth [T] (row r: position anchor+depth, depth-0 rows are 0..S-1 first,
  then each depth's rows sorted); cod.sampled.d{d} [n_d] (SpecForge's sampled_idx = anchor+d);
  cod.randperm_n [calls] (n of each torch.randperm call, in order); attn_mask [T,T] uint8
  (SpecForge's mask_mod, 1 = query row attends key row).
Row r (p = anchor+depth): token input_ids[p+1] at depth 0 (0 at p = S-1), else mask_token_id;
  feature hidden_state[p] at depth 0, else mask_hidden; RoPE position p; label softmax(teacher[p]
  over t2d ids); weight loss_mask[p] * t2d[argmax teacher[p]]. Ids are int64, t2d bool; floats are
  float64 except target_p, sampled_loss_mask and loss_den (float32: SpecForge computes them so).
expected: loss; loss_num (sum of masked row CE), loss_den (sum of sampled_loss_mask), derived here:
  loss = loss_num / T * float32(T / max(loss_den, 1e-6)) (SpecForge's float32 scale);
  logits [1,T,Vd]; grad.logits [1,T,Vd]; target_p [1,T,Vd]
  (softmax of teacher logits over the draft ids); sampled_loss_mask [1,T]; teacher_logits [1,S,V]
  (target head on the left-shifted target, last row zero); metric.<name> (SpecForge's metrics:
  loss_sum, loss_total, position_{d}_acc_sum/_total, full_acc_sum/_total, accuracy);
  grad.<param> for every parameter (mask_hidden included).
"""


def main(work):
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "README.txt"), "w") as f:
        f.write(README)
    failed = []
    for name in CASES:
        cfg, weights, inputs, exp = build_case(name)
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        for fname, t in (("weights", weights), ("inputs", inputs), ("expected", exp)):
            save_file(t, os.path.join(d, fname + ".safetensors"))
        bad = self_check(cfg, weights, inputs, exp)
        again = build_case(name)[1:]  # determinism: a second build equals the files, bit for bit
        for fname, t in zip(("weights", "inputs", "expected"), again):
            disk = load_file(os.path.join(d, fname + ".safetensors"))
            if disk.keys() != t.keys() or any(not torch.equal(disk[k], t[k]) for k in t):
                bad.append(f"{fname} differs on a second run")
        ctrl = build_case(name, mask_hidden_delta=0.1)[3]["loss"]  # negative control
        if abs(ctrl - exp["loss"]) <= 1e-6 * abs(exp["loss"]):
            bad.append("perturbed mask_hidden left the loss unchanged")
        n = inputs["cod.depth"].bincount().tolist()
        print(f"{name}: rows per depth {n}, randperm calls {inputs['cod.randperm_n'].tolist()}, "
              f"loss {exp['loss'].item():.10f} = {exp['loss_num'].item():.6f}/"
              f"{exp['loss_den'].item():.0f}, acc {exp['metric.full_acc_sum'].item():.0f}/"
              f"{exp['metric.full_acc_total'].item():.0f}, control loss {ctrl.item():.6f}, "
              f"checks, determinism, control -> {'FAIL: ' + '; '.join(bad) if bad else 'PASS'}")
        failed += [name] if bad else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
