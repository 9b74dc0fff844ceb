#!/usr/bin/env python3
"""A streaming producer of EAGLE3 training samples made by vLLM itself (docs/data.md "Streaming").

vLLM (the CPU build works; run it with the serving venv's python) generates each prompt's reply
greedily with its `extract_hidden_states` speculative method, which caches the target's hidden
states at the chosen layers for every token the target runs on; a KV connector writes them to a
safetensors file when the request finishes. This script turns each such file into ONE
SpecForge-format sample,

    torch.save({"input_ids":        int64 [S]         prompt + reply,
                "loss_mask":        int64 [S]         0 on the prompt, 1 on the reply,
                "hidden_state":     bf16  [1, S, H]   the target's final-norm output,
                "aux_hidden_state": bf16  [1, S, 3H]  the --layers, concatenated in layer order})

and publishes it into a spool with fsdp_spool.publish() (apps/spool/fsdp_spool.py), or, when
that module is missing, writes it into --out with a temporary file and os.replace. Samples are
named <prefix>data_<index>.ckpt, index = the prompt's position in the prompts file.

vLLM details (0.32):
  speculative_config = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                        "draft_model_config": {"hf_config":
                            {"eagle_aux_hidden_state_layer_ids": IDS}}}
  kv_transfer_config = {"kv_connector": "CpuHiddenStatesConnector",
                        "kv_connector_module_path": "vllm_producer", "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"shared_storage_path": DIR}}
  IDS are hidden_states indices (k = the residual stream after k decoder layers; ascending,
  since vLLM captures in layer order) and always end with num_hidden_layers: the last layer
  BEFORE the final RMSNorm, which this script applies itself (model.norm.weight and
  rms_norm_eps of the target). vLLM's stock ExampleHiddenStatesConnector copies through CUDA
  streams and pinned memory and fails on a CPU host ("Found no NVIDIA driver on your system",
  in _submit_async_write); CpuHiddenStatesConnector below is the same connector with a plain
  synchronous CPU copy-and-write. Files hold {"hidden_states": [T, len(IDS), H] in the model
  dtype, "token_ids": [T]}. Each request asks for the generated tokens too
  (kv_transfer_params {"include_output_tokens": true}), so T = prompt + reply - 1: the last
  sampled token never went through the target. --mode decode (the default) keeps that: the
  sample ends before the reply's last token. --mode prefill re-submits prompt + the whole reply
  (max_tokens 1, the way speculators' offline data generation runs) and captures every token.

Prompts (--prompts): a JSON list whose items are token-id lists (used as they are) or strings
(a user message, put through the target's chat template with the generation prompt), or the
`prompts` file of benchmarks/serving/pipeline.py ({"train": [{"prompt_ids": [...]}, ...]}) with
--split naming the list.

  VPY=~/.cache/fsdp-train/vllm-venv/bin/python
  $VPY benchmarks/streaming/vllm_producer.py --target TARGET_DIR --prompts prompts.json \\
      --spool SPOOL [--layers 1,14,26] [--max-tokens 64] [--end]
"""

import argparse
import fcntl
import io
import json
import os
import sys
import time
from pathlib import Path

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)

HERE = Path(__file__).resolve().parent
SPOOL_DIR = HERE.parents[1] / "apps" / "spool"


class _Done:
    """Stands for the connector's CUDA copy event: a CPU copy is complete when it returns."""

    @staticmethod
    def query():
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a synchronous CPU copy: no CUDA stream, event or
    pinned memory. Runs in vLLM's worker process (imported there by kv_connector_module_path)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        bs = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * bs + torch.arange(bs, dtype=torch.long)[None, :]).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots,
                                       pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC,
                              0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            from safetensors.torch import save_file
            save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()},
                      pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: the file is complete
        self._req_copy_events[pending.req_id] = _Done()


def fail(msg):
    sys.exit(f"error: {msg}")


def load_prompts(path, split, tok):
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        if split not in data:
            fail(f"{path}: no list '{split}' (it has {sorted(data)}); name one with --split")
        data = data[split]
    if not isinstance(data, list) or not data:
        fail(f"{path}: expected a non-empty JSON list of prompts")
    out = []
    for i, p in enumerate(data):
        if isinstance(p, dict):
            p = p.get("prompt_ids")
        if isinstance(p, str):
            text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True)
            p = tok(text, add_special_tokens=False)["input_ids"]
        if not (isinstance(p, list) and p and all(isinstance(t, int) for t in p)):
            fail(f"{path}: prompt {i} is neither a token-id list nor a string")
        out.append(p)
    return out


def resolve_layers(spec, convention, num_layers):
    """(aux hidden_states indices, the ids vLLM captures: aux + the last layer, ascending)."""
    if spec:
        ids = [int(x) for x in spec.replace(",", " ").split()]
    else:  # SpecForge's default, layer-output convention
        ids, convention = [1, num_layers // 2 - 1, num_layers - 4], "layer-output"
    aux = [i + 1 for i in ids] if convention == "layer-output" else ids
    if any(b <= a for a, b in zip(aux, aux[1:])) or aux[0] < 0 or aux[-1] > num_layers:
        fail(f"--layers {ids} ({convention}): must be strictly ascending, inside the target's "
             f"{num_layers} layers")
    return aux, sorted(set(aux + [num_layers]))


def rms_norm(x, weight, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class Publisher:
    def __init__(self, a):
        self.a = a
        self.publish = None
        if a.spool:
            sys.path.insert(0, str(SPOOL_DIR))
            try:
                from fsdp_spool import publish
                self.publish = publish
                self.dest = a.spool
            except ImportError:
                print(f"[producer] {SPOOL_DIR}/fsdp_spool.py not importable: writing files "
                      f"directly into {a.spool}", file=sys.stderr)
        if self.publish is None:
            self.dest = a.spool or a.out
        os.makedirs(self.dest, exist_ok=True)

    def __call__(self, name, data):
        if self.publish is not None:
            return self.publish(self.dest, name, data,
                                wait_for_trainer=not self.a.no_wait_for_trainer)
        final = Path(self.dest) / name
        tmp = Path(self.dest) / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return final


def read_connector_file(path, remove=True):
    """The connector's file once its writer has released the lock (else None); removed
    (with its lock) unless remove is False."""
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        fd = None  # no lock: use_synchronization_lock off, or already removed
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # still being written
        finally:
            os.close(fd)
    if not os.path.exists(path):
        return None
    from safetensors.torch import load_file
    data = load_file(path, device="cpu")
    if fd is not None:
        os.remove(lock)
    if remove:
        os.remove(path)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="Hugging Face target directory")
    ap.add_argument("--prompts", required=True, help="JSON prompts file (see above)")
    ap.add_argument("--split", default="train", help="the list to read from a pipeline.py "
                    "prompts file (default train)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--spool", default=None, help="publish into this spool (fsdp_spool)")
    ap.add_argument("--out", default=None, help="without --spool: a plain output directory")
    ap.add_argument("--prefix", default="", help="sample name prefix (one per producer)")
    ap.add_argument("--no-wait-for-trainer", action="store_true",
                    help="publish before a trainer has opened the spool")
    ap.add_argument("--end", action="store_true",
                    help="write END_OF_STREAM into the spool when done")
    ap.add_argument("--layers", default=None,
                    help="the 3 aux layers, e.g. 1,14,26 (default SpecForge's: 1, L/2-1, L-4)")
    ap.add_argument("--aux-layer-convention", choices=["layer-output", "hidden-states"],
                    default="layer-output",
                    help="layer-output (SpecForge's, fsdp-train's default: layer j = "
                    "hidden_states[j+1]) or hidden-states (vLLM's ids)")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode",
                    help="decode: the states of the generating pass (the reply's last token "
                    "left out); prefill: a second pass over prompt + the whole reply")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=4, help="requests in flight")
    ap.add_argument("--kv-cache-mib", type=int, default=512,
                    help="KV cache size; an explicit size skips vLLM CPU's free-memory check")
    ap.add_argument("--dtype", default="float32", help="vLLM's model dtype")
    ap.add_argument("--work-dir", default=None,
                    help="where the connector writes its files (default: a temporary "
                    "directory, removed at the end)")
    ap.add_argument("--keep-raw", action="store_true",
                    help="keep the connector's safetensors files in --work-dir (for checks)")
    ap.add_argument("--file-timeout", type=float, default=300.0,
                    help="seconds to wait for a finished request's file before giving up")
    ap.add_argument("--stats", default=None, help="write per-sample timings (JSON) here")
    a = ap.parse_args()
    if not a.spool and not a.out:
        fail("give --spool or --out")

    from safetensors import safe_open
    from transformers import AutoTokenizer
    cfg = json.loads((Path(a.target) / "config.json").read_text())
    L, H, eps = cfg["num_hidden_layers"], cfg["hidden_size"], float(cfg["rms_norm_eps"])
    aux, capture = resolve_layers(a.layers, a.aux_layer_convention, L)
    aux_pos = [capture.index(i) for i in aux]
    last_pos = capture.index(L)
    norm_w = None
    for f in sorted(Path(a.target).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            if "model.norm.weight" in st.keys():
                norm_w = st.get_tensor("model.norm.weight")
    if norm_w is None:
        fail(f"{a.target}: no model.norm.weight in its safetensors")
    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = load_prompts(a.prompts, a.split, tok)
    if a.limit:
        prompts = prompts[:a.limit]
    publisher = Publisher(a)
    if a.keep_raw and not a.work_dir:
        fail("--keep-raw needs --work-dir")
    if a.work_dir:
        work = Path(a.work_dir).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        import atexit
        import shutil
        import tempfile
        work = Path(tempfile.mkdtemp(prefix="vllm-hs-"))
        atexit.register(shutil.rmtree, work, True)

    # The connector class is imported by name in vLLM's spawned processes.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from vllm import LLM, SamplingParams
    t0 = time.time()
    llm = LLM(model=a.target, dtype=a.dtype, enforce_eager=True, seed=0,
              max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
              kv_cache_memory_bytes=a.kv_cache_mib << 20,
              speculative_config={
                  "method": "extract_hidden_states", "num_speculative_tokens": 1,
                  "draft_model_config": {"hf_config": {
                      "eagle_aux_hidden_state_layer_ids": capture}}},
              kv_transfer_config={
                  "kv_connector": "CpuHiddenStatesConnector",
                  "kv_connector_module_path": "vllm_producer", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": str(work)}})
    engine = llm.llm_engine
    load_s = time.time() - t0
    print(f"[producer] vLLM up in {load_s:.1f} s; capturing hidden_states {capture} "
          f"(aux {aux}, last {L} + final norm); {len(prompts)} prompts", file=sys.stderr)

    gen_params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens,
                                extra_args={"kv_transfer_params": {"include_output_tokens":
                                                                   a.mode == "decode"}})
    pre_params = SamplingParams(temperature=0.0, max_tokens=1)
    todo = list(enumerate(prompts))
    in_flight = {}   # request id -> (index, prompt, stage)
    waiting = []     # (path, index, prompt, reply, since): files being written
    added_at, stats, published = {}, [], 0
    alias = {}       # the id vLLM reports -> the key of in_flight

    def submit(rid, ids, params, entry):
        internal = engine.add_request(rid, {"prompt_token_ids": ids}, params)
        in_flight[internal] = entry
        if internal != rid:
            alias[rid] = internal

    t1 = time.time()
    while todo or in_flight or waiting:
        while todo and len(in_flight) < a.max_num_seqs:
            i, p = todo.pop(0)
            submit(f"p{i}", p, gen_params, (i, p, "gen"))
            added_at[i] = time.time()
        outs = engine.step() if in_flight else []
        for o in outs:
            if not o.finished:
                continue
            i, p, stage = in_flight.pop(alias.pop(o.request_id, o.request_id))
            reply = list(o.outputs[0].token_ids)
            path = (o.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                fail(f"request {o.request_id}: no hidden_states_path in kv_transfer_params "
                     f"({o.kv_transfer_params})")
            if stage == "gen" and a.mode == "prefill":
                waiting.append((path, None, None, None, time.time()))  # prompt only: dropped
                submit(f"p{i}-full", p + reply, pre_params, (i, p, ("pre", reply)))
                continue
            if stage != "gen":
                reply = stage[1]
            waiting.append((path, i, p, reply, time.time()))
        still = []
        for path, i, p, reply, since in waiting:
            data = read_connector_file(path, remove=i is None or not a.keep_raw)
            if data is None:
                if time.time() - since > a.file_timeout:
                    fail(f"{path}: not written {a.file_timeout:.0f} s after its request "
                         "finished (see vLLM's log for a hidden-states write error)")
                still.append((path, i, p, reply, since))
                continue
            if i is None:
                continue
            ids = data["token_ids"].to(torch.int64)
            seq = p + reply
            if ids.tolist() != seq[:ids.numel()] or ids.numel() < len(p):
                fail(f"prompt {i}: the connector's token_ids ({ids.numel()}) are not "
                     f"prompt + reply ({len(p)} + {len(reply)})")
            if ids.numel() == len(p):  # decode mode, a one-token reply: nothing to learn
                print(f"[producer] prompt {i}: the reply has no token the target ran on "
                      f"({len(reply)} generated); skipped", file=sys.stderr)
                continue
            hs = data["hidden_states"]  # [S, len(capture), H]
            mask = torch.zeros_like(ids)
            mask[len(p):] = 1
            rec = {"input_ids": ids, "loss_mask": mask,
                   "hidden_state": rms_norm(hs[:, last_pos], norm_w, eps)
                   .to(torch.bfloat16)[None].contiguous(),
                   "aux_hidden_state": torch.cat([hs[:, j] for j in aux_pos], dim=-1)
                   .to(torch.bfloat16)[None].contiguous()}
            buf = io.BytesIO()
            torch.save(rec, buf)
            name = f"{a.prefix}data_{i}.ckpt"
            publisher(name, buf.getvalue())
            published += 1
            stats.append({"index": i, "name": name, "prompt": len(p), "reply": len(reply),
                          "tokens": int(ids.numel()),
                          "seconds": round(time.time() - added_at[i], 3)})
        waiting = still
        if waiting and not in_flight:
            time.sleep(0.01)
    gen_s = time.time() - t1
    if a.end and a.spool and publisher.publish is not None:
        from fsdp_spool import end_stream
        end_stream(a.spool)
    summary = {"published": published, "dest": str(publisher.dest), "mode": a.mode,
               "capture_ids": capture, "aux_ids": aux, "load_s": round(load_s, 1),
               "generate_s": round(gen_s, 2),
               "per_prompt_s": round(gen_s / max(published, 1), 3)}
    if a.stats:
        Path(a.stats).write_text(json.dumps({"summary": summary, "samples": stats}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
