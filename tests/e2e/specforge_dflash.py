"""fsdp-train's DFlash draft and objective against SpecForge 0.2.0's own code (PyPI specforge,
installed without its dependencies by launch/setup.sh): the same weights, features and anchors
through SpecForge's DFlashDraftModel + OnlineDFlashModel (the dense-mask path, eager attention)
and through fsdp-train's (tests/tools/dflash_loss). Compared in float64 (in float32, the gradients
of the norm weights, sums over every block position, differ by about 1e-6 from summation order
alone): the loss, its numerator and denominator, the accuracy counts, the draft's block outputs,
and the gradient of every draft parameter and of the features, within 1e-6 relative to each
tensor's largest value (SpecForge keeps its RoPE tables and decay weights in float32, which
bounds the agreement near 1e-7).
fsdp-train's simulated acceptance is checked against this script's own count from the same
outputs. Cases: full attention, a sliding layer, the loss decay, chunked and unchunked
objectives, the three D-PACE losses. Usage: specforge_dflash.py DFLASH_LOSS WORKDIR
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel  # noqa: E402
from specforge.modeling.draft.dflash import DFlashDraftModel  # noqa: E402

TOOL, WORK = sys.argv[1], sys.argv[2]
V, H, BS, S, B, MASK = 64, 32, 4, 19, 3, 63
os.makedirs(WORK, exist_ok=True)


def config(sliding):
    c = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": H, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2, "vocab_size": V,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "block_size": BS,
        "num_target_layers": 8,
        "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": MASK},
    }
    if sliding:
        c.update(use_sliding_window=True, sliding_window=6,
                 layer_types=["full_attention", "sliding_attention"])
    return c


def inputs(gen):
    ids = torch.randint(0, V - 1, (B, S), generator=gen)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, :5] = 0          # a prompt
    mask[1, 9:12] = 0        # a gap
    mask[2, 3:] = 0          # a short row: fewer anchors, padded blocks
    hidden = torch.randn(B, S, 3 * H, generator=gen, dtype=torch.float64)
    # Anchors: a random subset of each row's candidates, the last near the end of the sequence.
    cand = [[p for p in range(S - 1) if mask[b, p] and mask[b, p + 1]] for b in range(B)]
    n = 5
    anchors = torch.zeros(B, n, dtype=torch.long)
    keep = torch.zeros(B, n, dtype=torch.bool)
    for b in range(B):
        perm = torch.randperm(len(cand[b]), generator=gen)[:n].tolist()
        chosen = sorted({cand[b][i] for i in perm} | ({cand[b][-1]} if b == 0 else set()))[:n]
        anchors[b, :len(chosen)] = torch.tensor(chosen)
        keep[b, :len(chosen)] = True
    return ids, mask, hidden, anchors, keep


def run_case(name, sliding, loss_type="dflash", chunk=0, gamma=None, alpha=0.5, flip=False):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(7)
    cfg = config(sliding)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    qc = Qwen3Config(**{k: v for k, v in cfg.items() if k != "architectures"})
    qc._attn_implementation = "eager"
    torch.manual_seed(0)
    draft = DFlashDraftModel(qc).double()
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.2
                    + (1.0 if p.dim() == 1 else 0.0))
    embed = torch.nn.Embedding(V, H).double()
    lm_head = torch.nn.Linear(H, V, bias=False).double()
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, H, generator=gen, dtype=torch.float64))
        lm_head.weight.copy_(torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.3)
    for p in list(embed.parameters()) + list(lm_head.parameters()):
        p.requires_grad_(False)
    ids, mask, hidden, anchors, keep = inputs(gen)
    model = OnlineDFlashModel(draft, lm_head, embed, mask_token_id=MASK, block_size=BS,
                              attention_backend="sdpa", num_anchors=512,
                              loss_decay_gamma=gamma, objective_chunk_blocks=chunk,
                              loss_type=loss_type, dpace_alpha=alpha)
    model._sample_anchor_positions = lambda seq_len, loss_mask, device: (anchors, keep)
    captured = {}
    orig = draft.forward

    def capture(*a, **k):
        out = orig(*a, **k)
        captured["out"] = out.detach()
        return out

    draft.forward = capture
    # Labels the draft gets right: the tokens after some anchors become the draft's own
    # predictions (only anchor tokens feed the draft, and no anchor is rewritten), so the
    # simulated acceptance has runs longer than one to count.
    with torch.no_grad():
        model(ids, hidden, mask)
        pred = lm_head(captured["out"]).argmax(-1).view(B, anchors.shape[1], BS)
    anchor_set = {(b, a) for b in range(B) for a, k in zip(anchors[b].tolist(), keep[b].tolist()) if k}
    for b in range(B):
        for n in range(0, anchors.shape[1], 2):
            if not keep[b, n]:
                continue
            for k in range(1, 1 + (n + b) % BS):
                p = anchors[b, n].item() + k
                if p < S and (b, p) not in anchor_set:
                    ids[b, p] = pred[b, n, k]
    h = hidden.clone().requires_grad_(True)
    loss, _acc, metrics = model(ids, h, mask)
    loss.backward()
    num, den = metrics["loss_terms"]
    correct, acc_den = metrics["ratio_metrics"]["acc"]

    sd = {k: v.detach().contiguous() for k, v in draft.state_dict().items()}
    if flip:  # negative control: fsdp-train gets another layer-1 value weight (q_proj would not do: q_norm cancels its scale)
        sd["layers.1.self_attn.v_proj.weight"] = sd["layers.1.self_attn.v_proj.weight"] * 1.5
    save_file(sd, os.path.join(d, "weights.safetensors"))
    save_file({"input_ids": ids, "loss_mask": mask, "hidden_states": hidden, "anchors": anchors,
               "keep": keep.to(torch.uint8), "embed": embed.weight.detach().contiguous(),
               "lm_head": lm_head.weight.detach().contiguous()},
              os.path.join(d, "inputs.safetensors"))
    opts = f"{loss_type} {MASK} {chunk} {gamma or 0} {alpha}"
    subprocess.run([TOOL, os.path.join(d, "config.json"), os.path.join(d, "weights.safetensors"),
                    os.path.join(d, "inputs.safetensors"), os.path.join(d, "out.safetensors"),
                    opts], check=True)
    ours = load_file(os.path.join(d, "out.safetensors"))

    ref = {"loss": loss.detach(), "loss_num": num.detach(), "loss_den": den.detach(),
           "correct": correct, "accuracy_den": acc_den, "output_hidden": captured["out"],
           "grad.hidden_states": h.grad}
    for k, p in draft.named_parameters():
        ref["grad." + k] = p.grad
    worst, where = 0.0, ""
    for k, r in ref.items():
        o = ours[k].to(r.dtype).reshape(r.shape)
        scale = max(r.abs().max().item(), 1e-12)
        err = (o - r).abs().max().item() / scale
        if err > worst:
            worst, where = err, k
    # The simulated acceptance from the same block outputs, counted here independently.
    with torch.no_grad():
        logits = lm_head(captured["out"]).view(B, anchors.shape[1], BS, V)
        pred = logits.argmax(-1)
        idx = (anchors.unsqueeze(-1) + torch.arange(BS)).clamp(max=S - 1)
        tgt = torch.gather(ids.unsqueeze(1).expand(-1, anchors.shape[1], -1), 2, idx)
        valid = (keep.unsqueeze(-1) & (anchors.unsqueeze(-1) + torch.arange(BS) < S)
                 & (torch.arange(BS) > 0) & (torch.gather(mask.unsqueeze(1).expand(
                     -1, anchors.shape[1], -1), 2, idx) > 0))
        accept_num, accept_den = 0.0, 0.0
        for b in range(B):
            for n in range(anchors.shape[1]):
                if not valid[b, n].any():
                    continue
                run = 0
                for k in range(1, BS):
                    if valid[b, n, k] and pred[b, n, k] == tgt[b, n, k]:
                        run += 1
                    else:
                        break
                accept_num += run + 1
                accept_den += 1
    accept_ok = (abs(ours["accept_num"].item() - accept_num) < 1e-9
                 and abs(ours["accept_den"].item() - accept_den) < 1e-9)
    ok = worst <= 1e-6 and accept_ok
    print(f"{name}: loss {loss.item():.6f} worst relative error {worst:.2e} ({where}), "
          f"acceptance {ours['accept_num'].item():.0f}/{ours['accept_den'].item():.0f} "
          f"(script {accept_num:.0f}/{accept_den:.0f}) -> {'PASS' if ok else 'FAIL'}")
    return ok


cases = [
    ("full", dict(sliding=False)),
    ("sliding", dict(sliding=True)),
    ("decay_chunked", dict(sliding=True, gamma=4.0, chunk=2)),
    ("chunk1", dict(sliding=False, chunk=1)),
    ("dpace", dict(sliding=False, loss_type="dpace", chunk=2, alpha=0.3)),
    ("dpace_cumulative", dict(sliding=False, loss_type="dpace-cumulative-confidence-only")),
    ("dpace_continuation", dict(sliding=True, loss_type="dpace-continuation-value-only", chunk=3)),
]
failed = [name for name, kw in cases if not run_case(name, **kw)]
control = run_case("control", sliding=False, flip=True)
print(f"negative control (another layer-1 v_proj): {'differs as it must' if not control else 'MATCHED: the comparison cannot fail'}")
if failed or control:
    sys.exit(1)
