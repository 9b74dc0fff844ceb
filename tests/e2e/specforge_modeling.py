"""fsdp-train's draft against SpecForge's own modeling code (PyPI specforge 0.2.0, installed
without its dependencies by launch/setup.sh): the same weights and inputs through SpecForge's
LlamaForCausalLMEagle3 (sdpa backend, its cached TTT attention) and through fsdp-train's model
(tests/tools/draft_logits), logits of every TTT step compared on the valid rows in float32.

Cases: plain EAGLE3; EAGLE3.1's fc_norm (SpecForge's per-layer norms before fc); fc_norm with
norm_output as vLLM and speculators read it (the final norm's output fed to the next step); and
the Qwen3 layer (Eagle3Qwen3ForCausalLM, vLLM's qwen3_eagle3): SpecForge has no such draft, so
its Llama layer gets transformers' own Qwen3RMSNorm over each head of q_proj's and k_proj's
outputs (where vLLM's Qwen3Attention applies q_norm/k_norm: after the projection, before RoPE).
SpecForge 0.2.0 reads norm_output otherwise (true, its default: norm before lm_head and the
pre-norm state fed forward; false: no norm before lm_head), so for that case the script feeds
SpecForge's own norm output forward itself. Usage: specforge_modeling.py DRAFT_LOGITS WORKDIR
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SpecForge's RMSNorm is torch.compile'd

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.llama.configuration_llama import LlamaConfig  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

from specforge.modeling.draft.llama3_eagle import (  # noqa: E402
    LlamaForCausalLMEagle3,
    prepare_decoder_attention_mask,
)

TOOL, WORK = sys.argv[1], sys.argv[2]
T, B, S = 4, 2, 7
os.makedirs(WORK, exist_ok=True)


def config(fc_norm, norm_output, qwen3=False):
    c = {
        "architectures": ["Eagle3Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLMEagle3"],
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_hidden_layers": 1,
        "vocab_size": 64,
        "draft_vocab_size": 24,
        "target_hidden_size": 20,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if fc_norm:
        c["fc_norm"] = True
    if norm_output:
        c["norm_output"] = True
    if qwen3:
        c["model_type"] = "qwen3"
    return c


def add_qk_norm(model, eps):
    """Qwen3 layers on SpecForge's Llama draft: per-head RMSNorm on q_proj's and k_proj's outputs,
    registered as self_attn.q_norm/k_norm (vLLM's names), applied before SpecForge's RoPE."""
    for layer in [model.midlayer]:
        attn = layer.self_attn
        for proj, name in ((attn.q_proj, "q_norm"), (attn.k_proj, "k_norm")):
            norm = Qwen3RMSNorm(attn.head_dim, eps=eps)
            setattr(attn, name, norm)

            def hook(_m, _i, out, norm=norm, d=attn.head_dim):
                return norm(out.view(*out.shape[:-1], -1, d)).view(out.shape)

            proj.register_forward_hook(hook)


def specforge_logits(model, ids, mask, aux, feed_normed):
    """SpecForge's offline TTT loop (its eagle3 model.py, sdpa backend) on one micro-batch."""
    with torch.no_grad():
        hidden = model.project_hidden_states(aux)
        attn = prepare_decoder_attention_mask(mask, (B, S), hidden, 0)
        pos = torch.arange(S).unsqueeze(0)
        cache = [[], []]
        out = []
        step_ids = ids
        for _ in range(T):
            emb = model.embed_input_ids(step_ids).to(hidden.dtype)
            h = model.backbone(emb, hidden, cache, attn, pos)
            if feed_normed:
                n = model.norm(h)
                out.append(model.lm_head(n))
                hidden = n
            else:
                out.append(model.compute_logits(h))
                hidden = h
            step_ids = torch.cat([step_ids[:, 1:], torch.zeros_like(step_ids[:, :1])], 1)
        return out


def run_case(name, fc_norm, norm_output, qwen3=False):
    torch.manual_seed(1234)
    ours = config(fc_norm, norm_output, qwen3)
    theirs = dict(ours)
    theirs.pop("norm_output", None)  # SpecForge's default (true): norm before lm_head
    theirs.pop("model_type", None)
    model = LlamaForCausalLMEagle3(LlamaConfig(**theirs), attention_backend="sdpa").float()
    if qwen3:
        add_qk_norm(model, ours["rms_norm_eps"])
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.uniform_(0.5, 1.5)  # ones would hide a missing or misplaced norm
            else:
                p.uniform_(-0.25, 0.25)
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(ours, f)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k not in ("d2t", "t2d")}
    save_file(sd, os.path.join(d, "weights.safetensors"))
    ids = torch.randint(0, 64, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 5:] = 0
    aux = torch.randn(B, S, 3 * 20) * 2.0
    save_file({"input_ids": ids, "attention_mask": mask, "aux": aux},
              os.path.join(d, "inputs.safetensors"))
    want = specforge_logits(model, ids, mask, aux, feed_normed=norm_output)
    subprocess.run([TOOL, os.path.join(d, "config.json"), os.path.join(d, "weights.safetensors"),
                    os.path.join(d, "inputs.safetensors"), os.path.join(d, "out.safetensors"),
                    str(T)], check=True)
    got = load_file(os.path.join(d, "out.safetensors"))
    valid = mask.bool()
    worst = 0.0
    for i in range(T):
        a, b = got[f"logits_{i}"][valid].double(), want[i][valid].double()
        rel = ((a - b).norm() / b.norm()).item()
        worst = max(worst, rel)
        print(f"{name}: step {i}: relative difference {rel:.3e}")
    # The same weights with the variant switched off must differ: the comparison can fail.
    ok = worst < 1e-6
    print(f"{name}: worst {worst:.3e} -> {'PASS' if ok else 'FAIL'}")
    return ok


results = [
    run_case("plain", False, False),
    run_case("fc_norm", True, False),
    run_case("fc_norm_norm_output", True, True),
    run_case("qwen3", False, False, qwen3=True),
]
# Negative control: fsdp-train with fc_norm against SpecForge without it must not match.
torch.manual_seed(1234)
ctrl = LlamaForCausalLMEagle3(LlamaConfig(**config(False, False)), attention_backend="sdpa").float()
d = os.path.join(WORK, "fc_norm")
ctrl_sd = load_file(os.path.join(d, "weights.safetensors"))
ctrl.load_state_dict({k: v for k, v in ctrl_sd.items() if not k.startswith("fc_norm")}, strict=False)
inp = load_file(os.path.join(d, "inputs.safetensors"))
base = specforge_logits(ctrl, inp["input_ids"], inp["attention_mask"], inp["aux"], False)
got = load_file(os.path.join(d, "out.safetensors"))
v = inp["attention_mask"].bool()
diff = ((got["logits_0"][v] - base[0][v]).norm() / base[0][v].norm()).item()
print(f"control: fc_norm vs no fc_norm differ by {diff:.3e}")
results.append(diff > 1e-3)
# Negative control: the Qwen3 draft's weights through fsdp-train as a Llama layer (no q/k norms).
d = os.path.join(WORK, "qwen3")
llama_cfg = config(False, False)
with open(os.path.join(d, "config_llama.json"), "w") as f:
    json.dump(llama_cfg, f)
sd = {k: t for k, t in load_file(os.path.join(d, "weights.safetensors")).items()
      if not k.endswith(("q_norm.weight", "k_norm.weight"))}
save_file(sd, os.path.join(d, "weights_llama.safetensors"))
subprocess.run([TOOL, os.path.join(d, "config_llama.json"), os.path.join(d, "weights_llama.safetensors"),
                os.path.join(d, "inputs.safetensors"), os.path.join(d, "out_llama.safetensors"), "1"],
               check=True)
inp = load_file(os.path.join(d, "inputs.safetensors"))
v = inp["attention_mask"].bool()
a = load_file(os.path.join(d, "out_llama.safetensors"))["logits_0"][v]
b = load_file(os.path.join(d, "out.safetensors"))["logits_0"][v]
diff = ((a - b).norm() / b.norm()).item()
print(f"control: Qwen3 layer vs Llama layer differ by {diff:.3e}")
results.append(diff > 1e-3)
sys.exit(0 if all(results) else 1)
