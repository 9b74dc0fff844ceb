#!/usr/bin/env python3
# Self-checks of the reference trainer against second, deliberately naive formulations of docs/reference.md
# (per-query loops, torch's DistributedSampler, the written LR formula). Runs in seconds on CPU;
# must never depend on fsdp-train or on real data. Exit code 1 on any mismatch.
"""python benchmarks/reference/selftest.py"""

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import build_vocab_mapping, collate, epoch_microbatches  # noqa: E402
from eagle3_model import DraftConfig, Eagle3Draft, target_distribution  # noqa: E402
from train import lr_at  # noqa: E402

FAILS = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        FAILS.append(name)


def naive_unroll(model, batch, target_p, pos_mask, T):
    """Per-(step, sample, position, head) loops over the allowed keys of docs/reference.md §3.2."""
    c = model.c
    ids0, lm0 = batch["input_ids"], batch["loss_mask"]
    B, S = ids0.shape
    valid = batch["attention_mask"].sum(1).tolist()
    L = model.midlayer
    h = model.fc(batch["aux"].double())
    keys, vals, plosses = [], [], []
    d = c.head_dim
    # cos/sin in fp32 as docs/reference.md §3 prescribes; everything else fp64.
    inv = 1.0 / (c.theta ** (torch.arange(0, d, 2).float() / d))

    def rot(x, pos):
        ang = torch.tensor(float(pos)) * inv
        cos = torch.cat([ang, ang]).cos().double()
        sin = torch.cat([ang, ang]).sin().double()
        a, b = x[: d // 2], x[d // 2:]
        return x * cos + torch.cat([-b, a]) * sin

    for i in range(T):
        ids = torch.zeros_like(ids0)
        ids[:, : S - i] = ids0[:, i:]
        pm = torch.zeros_like(pos_mask)
        pm[:, : S - i] = pos_mask[:, i:]
        emb = model.embed_tokens(ids).double()
        x = torch.cat([L.input_layernorm(emb), L.hidden_norm(h)], -1)
        q = L.self_attn.q_proj(x).view(B, S, c.heads, d)
        k = L.self_attn.k_proj(x).view(B, S, c.kv_heads, d)
        v = L.self_attn.v_proj(x).view(B, S, c.kv_heads, d)
        q = torch.stack([torch.stack([torch.stack([rot(q[b, t, n], t + i) for n in range(c.heads)])
                                      for t in range(S)]) for b in range(B)])
        k = torch.stack([torch.stack([torch.stack([rot(k[b, t, n], t + i)
                                                   for n in range(c.kv_heads)])
                                      for t in range(S)]) for b in range(B)])
        keys.append(k)
        vals.append(v)
        att = torch.zeros(B, S, c.heads, d, dtype=torch.float64)
        g = c.heads // c.kv_heads
        for b in range(B):
            for t in range(S):
                for n in range(c.heads):
                    ks = [keys[0][b, s, n // g] for s in range(min(t + 1, valid[b]))]
                    vs = [vals[0][b, s, n // g] for s in range(min(t + 1, valid[b]))]
                    ks += [keys[j][b, t, n // g] for j in range(1, i + 1)]
                    vs += [vals[j][b, t, n // g] for j in range(1, i + 1)]
                    if not ks:
                        continue
                    sc = torch.stack([q[b, t, n] @ kk for kk in ks]) / math.sqrt(d)
                    p = torch.softmax(sc, 0)
                    att[b, t, n] = sum(pp * vv for pp, vv in zip(p, vs))
        h1 = h + L.self_attn.o_proj(att.reshape(B, S, -1))
        h = h1 + L.mlp(L.post_attention_layernorm(h1))
        logits = model.lm_head(model.norm(h))
        p = target_p[:, i:i + S]
        plosses.append(-(pm * (p * F.log_softmax(logits, -1)).sum(-1)).sum() / (B * S))
    return plosses


def test_unroll():
    cfg = DraftConfig({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 16,
                       "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "num_hidden_layers": 1, "vocab_size": 40, "draft_vocab_size": 12,
                       "rms_norm_eps": 1e-5, "rope_theta": 500.0})
    torch.manual_seed(0)
    model = Eagle3Draft(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
        used = torch.randperm(40)[:12].sort().values
        model.t2d.zero_()
        model.t2d[used] = True
    lens = [7, 5]
    samples = []
    for s in lens:
        samples.append({"input_ids": torch.randint(0, 40, (s,)),
                        "loss_mask": (torch.rand(s) > 0.3).long(),
                        "attention_mask": torch.ones(s, dtype=torch.int64),
                        "aux": torch.randn(s, 48, dtype=torch.float64),
                        "target_hidden": torch.randn(s, 16, dtype=torch.float64)})
    batch = collate(samples)
    T = 4
    head = torch.randn(40, 16, dtype=torch.float64)
    tp, pm = target_distribution(batch["target_hidden"], batch["loss_mask"], head, model.t2d, T)
    fast, _, _ = model(batch, tp, pm, T)
    with torch.no_grad():
        fast = [x.detach() for x in fast]
        slow = naive_unroll(model, batch, tp, pm, T)
    err = max(abs(float(a) - float(b)) / abs(float(b)) for a, b in zip(fast, slow))
    check("TTT unroll == per-query loops (fp64)", err < 1e-10, f"max rel err {err:.2e}")
    check("ploss nonzero", all(float(x) > 0 for x in slow))


def test_sampler():
    from torch.utils.data import DistributedSampler
    ok = True
    for n in (23, 24):
        for w in (1, 2, 3):
            for e in (0, 1, 2):
                for r in range(w):
                    s = DistributedSampler(list(range(n)), num_replicas=w, rank=r, shuffle=True,
                                           seed=5, drop_last=True)
                    s.set_epoch(e)
                    ref = list(s)
                    ref = [ref[i:i + 2] for i in range(0, len(ref) - 1, 2)]
                    ok &= ref == epoch_microbatches(n, e, 5, r, w, 2)
    check("sampler == torch DistributedSampler(drop_last) in micro-batches of 2", ok)


def test_lr():
    total, base = 200, 1e-4
    w = int(0.015 * total)  # 3
    ok = abs(lr_at(1, base, total, 0.015) - base / 3) < 1e-15
    ok &= abs(lr_at(3, base, total, 0.015) - base) < 1e-15
    ok &= abs(lr_at(4, base, total, 0.015) - base) < 1e-15  # cos(0) right after warmup
    ok &= abs(lr_at(total, base, total, 0.015) -
              base * 0.5 * (1 + math.cos(math.pi * (total - 1 - w) / (total - w)))) < 1e-15
    ok &= lr_at(total + 5, base, total, 0.015) == lr_at(total, base, total, 0.015)
    check("warmup-cosine schedule (docs/reference.md §6)", ok)


def test_vocab(tmp):
    ids = torch.tensor([5, 5, 3, 3, 9, 1, 1, 1, 7])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0])
    f = tmp / "v.ckpt"
    torch.save({"input_ids": ids, "loss_mask": mask}, f)
    d2t, t2d = build_vocab_mapping([str(f)], 100, 12, 3)
    # counts: 1->3, 3->2, 5->2, 9->1, 7 masked: top 3 = {1, 3, 5} (3 beats 5? no: tie -> smaller id)
    check("vocab mapping top-k with smaller-id ties", t2d.nonzero().flatten().tolist() == [1, 3, 5]
          and d2t.tolist() == [1, 2, 3])
    d2t, t2d = build_vocab_mapping([str(f)], 100, 12, 6)
    check("vocab mapping fills with smallest unused ids",
          t2d.nonzero().flatten().tolist() == [0, 1, 2, 3, 5, 9])


def main():
    import tempfile
    torch.set_num_threads(1)
    test_unroll()
    test_sampler()
    test_lr()
    with tempfile.TemporaryDirectory() as d:
        test_vocab(Path(d))
    print("selftest:", "FAILED " + ", ".join(FAILS) if FAILS else "all passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
