# W&B side process of fsdp-train (lib/metrics WandbSink): reads JSON lines on stdin and forwards
# them to the official wandb SDK. Embedded into the binary at build time and run as
# `python -c <this file>`. Never prints or stores the API key (it arrives in WANDB_API_KEY only).
#
# Protocol, one JSON object per line:
#   {"init": {"project": ..., "name": ..., "dir": ..., "config": {...},
#             "id": ... (optional), "resume": true (optional)}}            first line
#   {"step": 12, "scalars": {"train/loss": 1.5, ...}}                       any number
#   end of input                                                            finish the run
# After wandb.init succeeds the bridge writes {"ready": true, "run_dir": ..., "run_id": ...} to its original
# stdout (everything else it prints goes to stderr, which the trainer shares).
import json
import os
import sys


def main():
    ready_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # wandb's own messages go to stderr, keeping the handshake channel clean
    try:
        import wandb
    except Exception as e:  # ImportError, or a broken install
        sys.stderr.write("fsdp-train wandb bridge: cannot import wandb (%s); install it with "
                         "'pip install wandb' into the interpreter in FSDP_PYTHON\n" % e)
        return 3
    first = sys.stdin.readline()
    if not first:
        return 4
    init = json.loads(first).get("init", {})
    run = wandb.init(project=init.get("project") or "fsdp-train",
                     name=init.get("name") or None,
                     dir=init.get("dir") or None,
                     config=init.get("config") or {},
                     id=init.get("id") or None,
                     resume="allow" if init.get("resume") else None)
    ready_out.write(json.dumps({"ready": True, "run_dir": run.dir, "run_id": run.id}) + "\n")
    ready_out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if "scalars" in msg:
            scalars = {k: v for k, v in msg["scalars"].items() if v is not None}
            run.log(scalars, step=int(msg["step"]))
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
