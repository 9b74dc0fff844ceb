# MLflow side process of fsdp-train (lib/metrics MlflowSink): reads JSON lines on stdin and
# forwards them to the official mlflow package (mlflow-skinny is enough). Embedded into the binary
# at build time and run as `python -c <this file>`. Credentials (MLFLOW_TRACKING_TOKEN,
# MLFLOW_TRACKING_USERNAME/PASSWORD) reach MLflow through the environment only; a URI's
# user:password part is redacted in what the bridge prints and in the params it logs.
#
# Protocol, one JSON object per line:
#   {"init": {"tracking_uri": ..., "experiment_name": ..., "run_name": ... (optional),
#             "run_id": ... (optional: continue that run), "config": {...},
#             "tags": {...}}}                                               first line
#   {"step": 12, "scalars": {"train/loss": 1.5, ...}}                       any number
#   {"end": "FINISHED"} (or "FAILED")                                       optional, last
#   end of input                                                            end the run
# After the run is open the bridge writes {"ready": true, "run_id": ..., "experiment_id": ...,
# "tracking_uri": ...} to its original stdout (everything else it prints goes to stderr, which
# the trainer shares). Input that ends without an "end" line ends the run as KILLED.
import json
import math
import os
import re
import sys


def redact(uri):
    return re.sub(r"(://)[^/@]*@", r"\1<redacted>@", uri or "")


def is_file_store(uri):
    return uri.startswith("file:") or "://" not in uri and not uri.startswith(("databricks",
                                                                               "sqlite:"))


# MLflow accepts names of letters, digits, '_', '-', '.', ' ', '/'; anything else becomes '_'.
_BAD_KEY = re.compile(r"[^\w\-. /]")


def clean_key(key, limit):
    key = _BAD_KEY.sub("_", str(key)).strip("/") or "_"
    return key[:limit]


def flatten(prefix, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(prefix + "." + str(k) if prefix else str(k), v, out)
    elif isinstance(value, str):
        out[prefix] = value
    else:
        out[prefix] = json.dumps(value)


def cut(text, limit):
    # A value over the limit is an error in MLflow; keep its start and say it was cut.
    if len(text) <= limit:
        return text
    marker = "...[cut]"
    return text[: max(limit - len(marker), 0)] + marker


def main():
    ready_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # MLflow's own messages go to stderr, keeping the handshake channel clean
    first = sys.stdin.readline()
    if not first:
        return 4
    init = json.loads(first).get("init", {})
    uri = init.get("tracking_uri") or ""
    # MLflow 3 refuses the file store unless asked (it prefers a database); a local directory
    # is what a run without a tracking server uses, so allow it unless the user decided.
    if uri and is_file_store(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except Exception as e:  # ImportError, or a broken install
        sys.stderr.write("fsdp-train mlflow bridge: cannot import mlflow (%s); install it with "
                         "'pip install mlflow-skinny' (or mlflow) into the interpreter in "
                         "FSDP_PYTHON, or run launch/setup.sh\n" % e)
        return 3
    try:
        from mlflow.utils import validation
        param_limit = int(getattr(validation, "MAX_PARAM_VAL_LENGTH", 500))
        key_limit = int(getattr(validation, "MAX_ENTITY_KEY_LENGTH", 250))
        tag_limit = int(getattr(validation, "MAX_TAG_VAL_LENGTH", 5000))
    except Exception:
        param_limit, key_limit, tag_limit = 500, 250, 5000

    if uri:
        mlflow.set_tracking_uri(uri)
    tags = {clean_key(k, key_limit): cut(str(v), tag_limit)
            for k, v in (init.get("tags") or {}).items()}
    run = None
    resume_id = init.get("run_id") or None
    if resume_id:
        try:
            run = mlflow.start_run(run_id=resume_id)
        except Exception as e:
            sys.stderr.write("fsdp-train mlflow bridge: cannot continue run %s at %s (%s); "
                             "starting a new run\n" % (resume_id, redact(uri), e))
    if run is None:
        mlflow.set_experiment(init.get("experiment_name") or "fsdp-train")
        run = mlflow.start_run(run_name=init.get("run_name") or None, tags=tags)
    else:
        mlflow.set_tags(tags)
    run_id = run.info.run_id

    params = {}
    flatten("", init.get("config") or {}, params)
    params = {clean_key(k, key_limit): cut(redact(v), param_limit) for k, v in params.items()}
    if resume_id == run_id:
        # MLflow refuses to change a logged param: log the new keys, keep the old values.
        old = MlflowClient().get_run(run_id).data.params
        changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
        params = {k: v for k, v in params.items() if k not in old}
        if changed:
            sys.stderr.write("fsdp-train mlflow bridge: the resumed run keeps its logged values "
                             "of %s (MLflow params cannot change)\n" % ", ".join(changed))
    if params:
        mlflow.log_params(params)

    ready_out.write(json.dumps({"ready": True, "run_id": run_id,
                                "experiment_id": run.info.experiment_id,
                                "tracking_uri": redact(mlflow.get_tracking_uri())}) + "\n")
    ready_out.flush()
    status = "KILLED"
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if "scalars" in msg:
            scalars = {clean_key(k, key_limit): float(v) for k, v in msg["scalars"].items()
                       if v is not None and math.isfinite(v)}
            if scalars:
                mlflow.log_metrics(scalars, step=int(msg["step"]))
        elif "end" in msg:
            status = msg["end"]
    mlflow.end_run(status=status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
