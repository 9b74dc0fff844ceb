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
    # The optimizer step is every chart's x-axis as a metric of its own ("trainer/step"), not
    # W&B's history step: W&B drops a row whose history step is not above the last one logged,
    # so the steps re-run after a resume from an older checkpoint (a damaged newest one, a
    # restart past the last save) would vanish from the run; as a step metric they are kept.
    run.define_metric("trainer/step")
    run.define_metric("*", step_metric="trainer/step")
    ready_out.write(json.dumps({"ready": True, "run_dir": run.dir, "run_id": run.id}) + "\n")
    ready_out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if "scalars" in msg:
            scalars = {k: v for k, v in msg["scalars"].items() if v is not None}
            scalars["trainer/step"] = int(msg["step"])
            run.log(scalars)
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
