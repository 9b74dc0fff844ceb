"""fsdp-train's DSpark objective against SpecForge's own code (PyPI specforge 0.2.0): the same
draft config, heads' weights, batch, anchors and backbone output hidden4d through SpecForge's
DSparkDraftModel heads and OnlineDSparkModel (its block labels and _compute_dspark_loss, world
size 1) and through fsdp-train's (tests/tools/dspark_objective). Compared in float32 within 1e-6
relative: the loss, every additive term SpecForge reports (its ratio metrics' numerators and
denominators), the labels, the previous tokens, the loss weights, and the gradients with respect
to hidden4d and every head parameter.

The whole step too: SpecForge's OnlineDSparkModel.forward (its backbone over the blocks and the
features, labels, heads and loss) against fsdp-train's dspark_step (model/dspark_step.h, what the
trainer runs) on the same whole draft, features, anchors and target states, in float64 (SpecForge
computes parts of its loss in float32, which bounds the agreement near 5e-7): the loss, the terms,
the labels and the gradients of the features and of every draft parameter, one case per Markov
head variant.

The engine's acceptance too: each block's accepted count that fsdp-train's evaluation walks (the
leading run, from block position 0, of right teacher-forced argmaxes) must equal, exactly, this
script's own count from the draft logits SpecForge's OnlineDSparkModel computes (its
apply_logits_head's outputs, their argmax against its labels and eval mask). Before each case,
the labels after some anchors become the draft's own predictions (repeated until they are
stable: a label feeds the Markov head of the next position), so runs of every length occur.

Cases: no Markov head and the vanilla, gated and rnn heads; no confidence head, a confidence
head, and one reading the Markov embedding too; every block at once and chunks of 2 blocks (3
chunks of 5); no decay and loss_decay_gamma 3; plus the alphas where L1 is off (with and without
a confidence head, the latter without target states). Anchors come from SpecForge's own sampler
(seeded), so dropped blocks and labels past the sequence's end occur. Three negative controls must
differ: SpecForge without the decay against fsdp-train with it, SpecForge without its Markov
head against fsdp-train with it, and the accepted counts from block position 1 (DFlash's, whose
position 0 is the anchor) against fsdp-train's. Usage: specforge_dspark.py DSPARK_OBJECTIVE
WORKDIR
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

from specforge.algorithms.common.dflash_family_model import OnlineDSparkModel  # noqa: E402
from specforge.modeling.draft.dspark import DSparkDraftModel  # noqa: E402

TOOL, WORK = sys.argv[1], sys.argv[2]
B, S, BS, H, V, RANK, ANCHORS = 2, 16, 4, 16, 40, 6, 5
TOL = 1e-6
os.makedirs(WORK, exist_ok=True)

# Names of fsdp-train's terms and where SpecForge reports each: (ratio metric, 0 numerator /
# 1 denominator).
TERMS = {
    "correct_num": ("acc", 0), "eval_den": ("acc", 1),
    "ce_num": ("ce_loss", 0), "l1_num": ("l1_loss", 0),
    "confidence_num": ("confidence_loss", 0), "confidence_error_num": ("confidence_abs_error", 0),
    "ce_position_num": ("ce_position", 0), "correct_position_num": ("accuracy_position", 0),
    "position_den": ("ce_position", 1),
}
TARGET_TERMS = {
    "teacher_agreement_num": ("teacher_agreement", 0),
    "teacher_top1_num": ("teacher_top1_prob", 0), "draft_top1_num": ("draft_top1_prob", 0),
    "tau_num": ("tau_probabilistic", 0), "tau_den": ("tau_probabilistic", 1),
}


def draft_config(markov, confidence):
    method = {"target_layer_ids": [1, 3], "mask_token_id": V - 1}
    if markov:
        method.update(markov_rank=RANK, markov_head_type=markov)
    if confidence:
        method.update(enable_confidence_head=True,
                      confidence_head_with_markov=confidence == "with_markov")
    return Qwen3Config(
        hidden_size=H, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
        head_dim=4, num_hidden_layers=1, vocab_size=V, rms_norm_eps=1e-6,
        max_position_embeddings=64, layer_types=["full_attention"], block_size=BS,
        num_target_layers=6, architectures=["DSparkDraftModel"], dflash_config=method)


def build(markov, confidence, seed):
    cfg = draft_config(markov, confidence)
    cfg._attn_implementation = "sdpa"
    draft = DSparkDraftModel(cfg).float()
    gen = torch.Generator().manual_seed(seed)
    heads = {}
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.startswith(("markov_head.", "confidence_head.")):
                # Larger than the initialisation's 0.02, so the heads move the numbers.
                p.copy_((torch.rand(p.shape, generator=gen) - 0.5) * 1.2)
                heads[name] = p.detach().clone()
    return cfg, draft, heads


def batch(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (B, S), generator=gen)
    loss_mask = torch.ones(B, S, dtype=torch.long)
    loss_mask[0, :3] = 0
    loss_mask[1, :9] = 0  # few supervised pairs: some of row 1's blocks are dropped
    loss_mask[1, 12] = 0  # a gap inside a block: the cumulative eval mask stops there
    lm_head = torch.randn(V, H, generator=gen) * 0.4
    target_last = torch.randn(B, S, H, generator=gen)
    return ids, loss_mask, lm_head, target_last


def draft_logits(draft, run):
    """The draft logits SpecForge computes in run() (its apply_logits_head's outputs, every
    chunk's in block order), run without a graph, so once per chunk."""
    out = []
    orig = draft.apply_logits_head

    def capture(*a, **k):
        logits = orig(*a, **k)
        out.append(logits.detach())
        return logits

    draft.apply_logits_head = capture
    try:
        with torch.no_grad():
            run()
    finally:
        del draft.apply_logits_head
    return torch.cat(out, 1)


def agree_labels(ids, anchors, keep, predict):
    """Rewrites ids in place so that the leading labels of some blocks are the draft's
    predictions: in anchor order, each kept block whose labels no chosen block rewrote gets
    BS, BS - 1, ..., 1 (in turn) of them. predict(ids) is the draft's argmax [B, N, BS] for
    those ids; a prediction reads the labels before it (the Markov head's previous tokens, the
    anchor tokens), so this repeats until the ids are stable."""
    chosen = []  # (b, n, how many leading labels)
    for b in range(B):
        last, turn = -1, 0
        for n in range(anchors.shape[1]):
            a = anchors[b, n].item()
            if keep[b, n] and a + 1 > last:
                depth = BS - turn % BS
                chosen.append((b, n, depth))
                last, turn = a + depth, turn + 1
    for _ in range(S + 2):
        pred = predict(ids)
        new = ids.clone()
        for b, n, depth in chosen:
            for k in range(depth):
                p = anchors[b, n].item() + 1 + k
                if p < S:
                    new[b, p] = pred[b, n, k]
        if torch.equal(new, ids):
            return
        ids.copy_(new)
    raise AssertionError("the rewritten labels did not settle")


def accepted_counts(logits, target_ids, eval_mask, first=0):
    """Each block's leading run of right argmaxes over scored positions first..BS-1, counted
    here position by position."""
    pred = logits.argmax(-1)
    out = torch.zeros(target_ids.shape[:2], dtype=torch.long)
    for b in range(target_ids.shape[0]):
        for n in range(target_ids.shape[1]):
            for k in range(first, BS):
                if not (eval_mask[b, n, k] and pred[b, n, k] == target_ids[b, n, k]):
                    break
                out[b, n] += 1
    return out


def specforge_run(draft, lm_head_w, gamma, alphas, chunk, ids, loss_mask, target_last, hidden,
                  anchors=None, keep=None):
    lm_head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(lm_head_w)
    lm_head.weight.requires_grad_(False)
    model = OnlineDSparkModel(
        draft_model=draft, target_lm_head=lm_head, target_embed_tokens=torch.nn.Embedding(V, H),
        mask_token_id=V - 1, block_size=BS, attention_backend="sdpa", num_anchors=ANCHORS,
        loss_decay_gamma=gamma, dspark_ce_loss_alpha=alphas[0], dspark_l1_loss_alpha=alphas[1],
        dspark_confidence_head_alpha=alphas[2], objective_chunk_blocks=chunk)
    if anchors is None:
        torch.manual_seed(7)
        anchors, keep = model._sample_anchor_positions(S, loss_mask, ids.device)
    target_ids, eval_mask, safe = model._build_dspark_labels_and_mask(ids, loss_mask, anchors, keep)
    prev = torch.cat([torch.gather(ids, 1, anchors).unsqueeze(-1), target_ids[:, :, :-1]], -1)
    if hidden is None:
        return anchors, keep
    def run(h):
        return model._compute_dspark_loss(
            output_hidden=h, target_ids=target_ids, eval_mask=eval_mask, prev_token_ids=prev,
            safe_label_indices=safe, target_last_hidden_states=target_last)

    logits = draft_logits(draft, lambda: run(hidden))
    draft.zero_grad(set_to_none=True)
    leaf = hidden.clone().requires_grad_(True)
    loss, metrics = run(leaf)
    loss.backward()
    grads = {"grad.hidden4d": leaf.grad}
    for name, p in draft.named_parameters():
        if name.startswith(("markov_head.", "confidence_head.")):
            grads["grad." + name] = p.grad if p.grad is not None else torch.zeros_like(p)
    labels = {"target_ids": target_ids, "eval_mask": eval_mask, "prev_token_ids": prev,
              "loss_weights": model._dspark_loss_weight_mask(eval_mask)}
    return loss.detach(), metrics["ratio_metrics"], grads, labels, logits


def relative(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def prepare(name, markov, confidence, gamma, alphas, chunk, with_target=True):
    seed = sum(map(ord, name))
    cfg, draft, heads = build(markov, confidence, seed)
    ids, loss_mask, lm_head, target_last = batch(seed + 1)
    anchors, keep = specforge_run(draft, lm_head, gamma, alphas, chunk, ids, loss_mask,
                                  target_last, None)
    n = anchors.shape[1]
    hidden = torch.randn(B, n, BS, H, generator=torch.Generator().manual_seed(seed + 2))
    agree_labels(ids, anchors, keep, lambda x: specforge_run(
        draft, lm_head, gamma, alphas, chunk, x, loss_mask, target_last if with_target else None,
        hidden, anchors, keep)[4].argmax(-1))
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(cfg.to_json_string())
    save_file({k: v.contiguous() for k, v in heads.items()} or {"none": torch.zeros(1)},
              os.path.join(d, "weights.safetensors"))
    inputs = {"input_ids": ids, "loss_mask": loss_mask, "anchors": anchors, "keep_mask": keep,
              "hidden4d": hidden, "lm_head": lm_head,
              "options": torch.tensor([gamma or 0.0, *alphas, float(chunk)], dtype=torch.float64)}
    if with_target:
        inputs["target_last_hidden"] = target_last
    save_file(inputs, os.path.join(d, "inputs.safetensors"))
    want = specforge_run(draft, lm_head, gamma, alphas, chunk, ids, loss_mask,
                         target_last if with_target else None, hidden, anchors, keep)
    return {"name": name, "dir": d, "want": want, "draft": draft, "lm_head": lm_head,
            "inputs": inputs, "markov": markov}


def compare(case):
    loss, ratios, grads, labels, logits = case["want"]
    got = load_file(os.path.join(case["dir"], "out.safetensors"))
    worst, bad = 0.0, []
    # The engine's accepted counts: exactly the script's, from SpecForge's logits.
    counted = accepted_counts(logits, labels["target_ids"], labels["eval_mask"])
    if not torch.equal(got["accepted"], counted):
        bad.append(f"accepted {got['accepted'].tolist()} vs {counted.tolist()}")
    case["counted"] = counted
    for key, want in labels.items():
        if key == "loss_weights":
            worst = max(worst, relative(got[key], want))
        elif not torch.equal(got[key].to(want.dtype), want):
            bad.append(key)
    has_target = "tau_probabilistic" in ratios
    if bool(got["has_target"].item()) != has_target:
        bad.append("has_target")
    checks = [("loss", got["loss"], loss)]
    for ours, (metric, i) in TERMS.items():
        checks.append((ours, got[ours], ratios[metric][i]))
    for ours, (metric, i) in TARGET_TERMS.items():
        want = ratios[metric][i] if has_target else torch.zeros(())
        checks.append((ours, got[ours], want))
    checks += [(k, got[k], v) for k, v in grads.items()]
    for key, a, b in checks:
        rel = relative(a.reshape(b.shape), b)
        worst = max(worst, rel)
        if rel > TOL:
            bad.append(f"{key} ({rel:.2e})")
    ok = not bad
    runs = ",".join(str((counted == r).sum().item()) for r in range(BS + 1))
    print(f"{case['name']}: {len(checks)} values, worst {worst:.3e}, accepted counts 0..{BS}: "
          f"{runs} blocks -> {'PASS' if ok else 'FAIL'}" + ("" if ok else f": {', '.join(bad)}"))
    return ok


cases = []
for markov in (None, "vanilla", "gated", "rnn"):
    for confidence in ((None, "plain") if markov is None else (None, "plain", "with_markov")):
        for chunk in (0, 2):
            for gamma in (None, 3.0):
                name = f"{markov or 'nomarkov'}_{confidence or 'noconf'}_c{chunk}_g{gamma or 0:g}"
                cases.append(prepare(name, markov, confidence, gamma, (0.1, 0.9, 1.0), chunk))
# L1 off: the confidence head alone reads the target; and nothing does (no target states given).
cases.append(prepare("rnn_plain_nol1_c2", "rnn", "plain", 3.0, (0.7, 0.0, 0.5), 2))
cases.append(prepare("gated_noconf_nol1_notarget_c2", "gated", None, None, (1.0, 0.0, 1.0), 2,
                     with_target=False))


def prepare_whole(name, markov, confidence, gamma, alphas, chunk):
    """The whole step: SpecForge's OnlineDSparkModel.forward (backbone, labels, heads, loss) on
    the same whole draft, features, anchors and target states as fsdp-train's dspark_step. In
    float64: in float32 the gradients of the norm weights, sums over every block position, differ
    by up to 1e-6 from summation order alone (as in specforge_dflash.py)."""
    seed = sum(map(ord, name))
    cfg, draft, _ = build(markov, confidence, seed)
    draft = draft.double()
    gen = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.2
                    + (1.0 if p.dim() == 1 else 0.0))
    ids, loss_mask, lm_head_w, target_last = batch(seed + 1)
    lm_head_w, target_last = lm_head_w.double(), target_last.double()
    embed_w = torch.randn(V, H, generator=gen, dtype=torch.float64)
    context = torch.randn(B, S, 2 * H, generator=gen, dtype=torch.float64)
    lm_head = torch.nn.Linear(H, V, bias=False).double()
    embed = torch.nn.Embedding(V, H).double()
    with torch.no_grad():
        lm_head.weight.copy_(lm_head_w)
        embed.weight.copy_(embed_w)
    for p in list(lm_head.parameters()) + list(embed.parameters()):
        p.requires_grad_(False)
    model = OnlineDSparkModel(
        draft_model=draft, target_lm_head=lm_head, target_embed_tokens=embed, mask_token_id=V - 1,
        block_size=BS, attention_backend="sdpa", num_anchors=ANCHORS, loss_decay_gamma=gamma,
        dspark_ce_loss_alpha=alphas[0], dspark_l1_loss_alpha=alphas[1],
        dspark_confidence_head_alpha=alphas[2], objective_chunk_blocks=chunk)
    torch.manual_seed(7)
    anchors, keep = model._sample_anchor_positions(S, loss_mask, ids.device)
    model._sample_anchor_positions = lambda seq_len, mask, device: (anchors, keep)
    agree_labels(ids, anchors, keep, lambda x: draft_logits(
        draft, lambda: model(x, context, loss_mask, target_last)).argmax(-1))
    logits = draft_logits(draft, lambda: model(ids, context, loss_mask, target_last))
    target_ids, eval_mask, _ = model._build_dspark_labels_and_mask(ids, loss_mask, anchors, keep)
    prev = torch.cat([torch.gather(ids, 1, anchors).unsqueeze(-1), target_ids[:, :, :-1]], -1)
    draft.zero_grad(set_to_none=True)
    leaf = context.clone().requires_grad_(True)
    loss, _acc, metrics = model(ids, leaf, loss_mask, target_last)
    loss.backward()
    grads = {"grad.hidden_states": leaf.grad}
    for pname, p in draft.named_parameters():
        grads["grad." + pname] = p.grad if p.grad is not None else torch.zeros_like(p)
    labels = {"target_ids": target_ids, "eval_mask": eval_mask, "prev_token_ids": prev,
              "loss_weights": model._dspark_loss_weight_mask(eval_mask)}
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(cfg.to_json_string())
    save_file({k: v.detach().contiguous() for k, v in draft.state_dict().items()},
              os.path.join(d, "weights.safetensors"))
    save_file({"input_ids": ids, "loss_mask": loss_mask, "anchors": anchors, "keep_mask": keep,
               "hidden_states": context, "embed": embed_w, "lm_head": lm_head_w,
               "target_last_hidden": target_last,
               "options": torch.tensor([gamma or 0.0, *alphas, float(chunk)], dtype=torch.float64)},
              os.path.join(d, "inputs.safetensors"))
    return {"name": name, "dir": d,
            "want": (loss.detach(), metrics["ratio_metrics"], grads, labels, logits)}


# The whole step (backbone + heads + objective), one case per Markov head variant.
for markov, confidence, chunk, gamma in (("vanilla", "plain", 0, 3.0), ("gated", "with_markov", 2, None),
                                          ("rnn", None, 2, 3.0), (None, "plain", 0, None)):
    cases.append(prepare_whole(f"whole_{markov or 'nomarkov'}_{confidence or 'noconf'}_c{chunk}",
                               markov, confidence, gamma, (0.1, 0.9, 1.0), chunk))
print(f"cases {len(cases)}")

rc = subprocess.run([TOOL] + [c["dir"] for c in cases]).returncode
if rc != 0:
    print(f"FAIL: {TOOL} exited with {rc}")
    sys.exit(1)
results = [compare(c) for c in cases]


def control(case, label, gamma, drop_markov):
    """SpecForge with one thing left out must differ from fsdp-train's result with it."""
    inp = case["inputs"]
    draft = case["draft"]
    saved = draft.markov_head
    if drop_markov:
        draft.markov_head = None
    loss, _, grads, _, _ = specforge_run(
        draft, case["lm_head"], gamma, (0.1, 0.9, 1.0), 0, inp["input_ids"], inp["loss_mask"],
        inp.get("target_last_hidden"), inp["hidden4d"], inp["anchors"], inp["keep_mask"])
    draft.markov_head = saved
    got = load_file(os.path.join(case["dir"], "out.safetensors"))
    diff = max(relative(got["loss"], loss), relative(got["grad.hidden4d"], grads["grad.hidden4d"]))
    print(f"control {label}: differs by {diff:.3e}")
    return diff > 1e-3


by_name = {c["name"]: c for c in cases}
results.append(control(by_name["vanilla_plain_c0_g3"], "no decay", None, False))
results.append(control(by_name["rnn_noconf_c0_g0"], "no Markov head", None, True))
# The counts must take every value 0..BS over the cases and depend on where they start.
lengths = sorted({v for c in cases if "counted" in c for v in c["counted"].flatten().tolist()})
print(f"accepted counts seen {lengths} (every one of 0..{BS} required)")
results.append(lengths == list(range(BS + 1)))
off = [c["name"] for c in cases if "counted" in c and not torch.equal(
    accepted_counts(c["want"][4], c["want"][3]["target_ids"], c["want"][3]["eval_mask"], 1),
    load_file(os.path.join(c["dir"], "out.safetensors"))["accepted"])]
print(f"control accepted counts from position 1: differ in {len(off)} of {len(cases)} cases")
results.append(len(off) > 0)
sys.exit(0 if all(results) else 1)
