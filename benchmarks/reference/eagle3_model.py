# Reference EAGLE3 draft model in plain PyTorch (docs/reference.md §3-5): parameter names, RoPE, the
# test-time-training unroll with dense causal+diagonal attention, target distribution and loss.
# Knows nothing about distribution; must never read fsdp-train code (it is the independent check).
"""EAGLE3 draft model (LlamaForCausalLMEagle3, one decoder layer) and its TTT training loss."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class DraftConfig:
    """The keys of a LlamaForCausalLMEagle3 JSON config that the math needs (docs/reference.md §1.1)."""

    def __init__(self, cfg, source="draft config"):
        def need(key):
            if key not in cfg or cfg[key] is None:
                raise ValueError(f"{source}: missing key '{key}'")
            return cfg[key]

        arch = cfg.get("architectures")
        if arch != ["LlamaForCausalLMEagle3"]:
            raise ValueError(f"{source}: architectures must be [\"LlamaForCausalLMEagle3\"], "
                             f"got {arch}")
        if need("num_hidden_layers") != 1:
            raise ValueError(f"{source}: num_hidden_layers must be 1 "
                             "(multi-layer drafts are not supported)")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act must be silu")
        if cfg.get("rope_scaling") not in (None, {}):
            raise ValueError(f"{source}: rope_scaling is not supported by the reference trainer")
        self.hidden = need("hidden_size")
        self.inter = need("intermediate_size")
        self.heads = need("num_attention_heads")
        self.kv_heads = need("num_key_value_heads")
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.vocab = need("vocab_size")
        self.draft_vocab = cfg.get("draft_vocab_size") or self.vocab
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.max_pos = cfg.get("max_position_embeddings", 2048)
        self.theta = cfg.get("rope_theta") or 10000.0
        self.target_hidden = cfg.get("target_hidden_size") or self.hidden
        if self.heads % self.kv_heads:
            raise ValueError(f"{source}: num_attention_heads must be a multiple of "
                             "num_key_value_heads")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def upcast(t):
    """bf16/fp32 -> fp32 (the softmax precision of docs/reference.md §3.2); fp64 stays fp64 for the self-test."""
    return t if t.dtype == torch.float64 else t.float()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class KVCache:
    """The keys and values of the TTT steps so far, appended to by Attention.forward.

    A plain object rather than a list or tuple on purpose: sharding wrappers that hook every
    submodule (DeepSpeed ZeRO-3, a per-module FSDP2 wrap) rebuild list and tuple arguments when
    they walk a module's inputs, so appends made inside the module would land in a copy and later
    TTT steps would lose the earlier keys. Objects of other types are passed through untouched.
    """

    def __init__(self):
        self.keys, self.values = [], []


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x, cos, sin, cache, key_valid):
        """x [B,S,2H]; cos/sin [S,d] for positions t+i; cache: a KVCache of earlier steps' k, v.

        Step-0 keys are attended causally (and only where key_valid), the keys of steps 1..i at
        the query's own position (the diagonal); one fp32 softmax over both parts.
        """
        c = self.c
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache.keys.append(k)
        cache.values.append(v)
        rep = c.heads // c.kv_heads
        ks = [t.repeat_interleave(rep, dim=1) for t in cache.keys]
        vs = [t.repeat_interleave(rep, dim=1) for t in cache.values]
        scale = 1.0 / math.sqrt(c.head_dim)
        scores0 = upcast(torch.matmul(q, ks[0].transpose(-1, -2))) * scale  # [B,nh,S,S]
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        allowed = causal[None, None] & key_valid[:, None, None, :]
        scores0 = scores0.masked_fill(~allowed, float("-inf"))
        diag = [upcast((q * kj).sum(-1, keepdim=True)) * scale for kj in ks[1:]]  # [B,nh,S,1]
        probs = torch.softmax(torch.cat([scores0] + diag, dim=-1), dim=-1)
        # Rows with no allowed key (cannot happen for valid rows) would be NaN: zero them.
        probs = torch.nan_to_num(probs, nan=0.0).to(q.dtype)
        out = torch.matmul(probs[..., :S], vs[0])
        for j, vj in enumerate(vs[1:]):
            out = out + probs[..., S + j:S + j + 1] * vj
        out = out.transpose(1, 2).reshape(B, S, c.heads * c.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.inter, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.inter, bias=False)
        self.down_proj = nn.Linear(c.inter, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden, c.eps)
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = MLP(c)

    def forward(self, emb, h, cos, sin, cache, key_valid):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)
        h1 = h + self.self_attn(x, cos, sin, cache, key_valid)
        return h1 + self.mlp(self.post_attention_layernorm(h1))


class Eagle3Draft(nn.Module):
    """State-dict names exactly as docs/reference.md §3 (embed_tokens, fc, midlayer.*, norm, lm_head)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * c.target_hidden, c.hidden, bias=False)
        self.midlayer = DecoderLayer(c)
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = nn.Linear(c.hidden, c.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab, dtype=torch.bool))

    def rope(self, positions, dtype):
        # fp32 throughout, as HF Llama and docs/reference.md §3 compute it.
        d = self.c.head_dim
        inv = 1.0 / (self.c.theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).float() / d))
        ang = positions.float()[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, batch, target_p, position_mask, ttt_length):
        """Runs the TTT unroll; returns per-step (ploss, correct count, mask sum) lists.

        batch: input_ids/loss_mask/attention_mask [B,S], aux [B,S,3H]; target_p [B,S+T,Vd] fp32
        padded per docs/reference.md §4; position_mask [B,S] for step 0.
        """
        ids, loss_mask = batch["input_ids"], batch["loss_mask"]
        key_valid = batch["attention_mask"].bool()
        B, S = ids.shape
        h = self.fc(batch["aux"].to(self.fc.weight.dtype))
        cache = KVCache()
        plosses, corrects, denoms = [], [], []
        for i in range(ttt_length):
            cos, sin = self.rope(torch.arange(i, S + i, device=ids.device), h.dtype)
            emb = self.embed_tokens(ids).to(h.dtype)
            h = self.midlayer(emb, h, cos, sin, cache, key_valid)
            logits = upcast(self.lm_head(self.norm(h)))
            p = target_p[:, i:i + S]
            m = position_mask.to(logits.dtype)
            plogp = (p * F.log_softmax(logits, dim=-1)).sum(-1)
            plosses.append(-(m * plogp).sum() / (B * S))
            with torch.no_grad():
                hit = (logits.argmax(-1) == p.argmax(-1)).to(logits.dtype) * m
                corrects.append(hit.sum())
                denoms.append(loss_mask.sum().to(logits.dtype))
            if i + 1 < ttt_length:
                ids, loss_mask, position_mask = (shift_left(t)
                                                 for t in (ids, loss_mask, position_mask))
        return plosses, corrects, denoms


def shift_left(t):
    """Drop the first column and append a zero column (docs/reference.md §3.2)."""
    return F.pad(t[:, 1:], (0, 1), value=0)


@torch.no_grad()
def target_distribution(target_hidden, loss_mask, head, t2d, ttt_length):
    """docs/reference.md §4: bf16 logits over the full vocab for argmax, softmax over the t2d columns only."""
    logits = torch.matmul(target_hidden.to(head.dtype), head.t())  # [B,S,V]
    position_mask = loss_mask * t2d[logits.argmax(-1)].to(loss_mask.dtype)
    p = torch.softmax(upcast(logits[..., t2d]), dim=-1)
    vd = p.shape[-1]
    p = F.pad(p, (0, 0, 0, ttt_length), value=1.0 / vd)
    return p, position_mask
