// The environment-variable table and its readers (env.h). Standard library only: the launcher
// links this without LibTorch, so nothing here may throw fsdp::Error or include torch headers.
#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <dlfcn.h>

namespace fsdp::env {

namespace {

std::vector<Variable> build_table() {
  using T = Type;
  constexpr int64_t kInt32Max = 2147483647;
  return {
      {"FSDP_LOG_LEVEL",
       T::kChoice,
       "info",
       "log level when --log-level is not given (the flag wins)",
       0,
       0,
       {"trace", "debug", "info", "warn", "warning", "error", "off", "none"}},
      {"FSDP_PROGRESS",
       T::kChoice,
       "unset",
       "tty: the console progress line updates in place between log steps; lines: whole lines "
       "only; unset: in place only for a single process without a launcher (no mpirun, srun) "
       "writing to a terminal",
       0,
       0,
       {"tty", "lines"}},
      {"FSDP_PYTHON", T::kPath, "the build's Python",
       "the Python that runs the W&B and MLflow bridges of --report-to wandb / mlflow (needs "
       "the wandb / mlflow package); default: the Python the build was configured with (the "
       "setup venv) when that file exists, else python3 on PATH"},
      {"OMP_NUM_THREADS", T::kInteger, "unset",
       "with --threads 0 (the default) a whole number from 1 to 4096 here sets the CPU threads "
       "per rank; unset or anything else: the node's cores divided by its ranks",
       1, 4096},
      {"SGLANG_TORCH_PROFILER_DIR", T::kPath, "unset",
       "where --profile writes its traces when --profile-dir is not given (SpecForge's variable); "
       "unset: <output-dir>/profile"},
      {"WANDB_RUN_ID", T::kText, "unset",
       "a W&B run to log to; set, it replaces the run id a resumed run would continue (W&B "
       "reads it itself)"},
      {"WANDB_API_KEY", T::kText, "unset",
       "the W&B API key, passed only to the W&B bridge process (prefer it to --wandb-key)"},
      {"MLFLOW_TRACKING_URI", T::kText, "unset",
       "--report-to mlflow: the tracking server or store when --mlflow-tracking-uri is not "
       "given; unset: a file store in <output-dir>/mlruns"},
      {"MLFLOW_EXPERIMENT_NAME", T::kText, "unset",
       "--report-to mlflow: the experiment when --mlflow-experiment-name is not given; unset: "
       "fsdp-train"},
      {"MLFLOW_RUN_NAME", T::kText, "unset",
       "--report-to mlflow: the run name when --mlflow-run-name is not given (fsdp-train's; "
       "MLflow itself has no such variable); unset: MLflow picks one"},
      {"MLFLOW_RUN_ID", T::kText, "unset",
       "an MLflow run to log to; set, it replaces the run id a resumed run would continue "
       "(MLflow reads it itself, like its credentials MLFLOW_TRACKING_TOKEN, "
       "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)"},
      {"HF_HUB_CACHE", T::kPath, "unset",
       "Hugging Face hub cache searched for a repository id given as --target-model-path"},
      {"HF_HOME", T::kPath, "unset", "its hub/ directory is searched after HF_HUB_CACHE"},
      {"TRANSFORMERS_CACHE", T::kPath, "unset", "searched after HF_HOME/hub (older transformers)"},
      {"XDG_CACHE_HOME", T::kPath, "unset", "its huggingface/hub is searched after those"},
      {"HOME", T::kPath, "unset", "~/.cache/huggingface/hub is searched last"},
      {"FSDP_MPIRUN", T::kPath, "mpirun", "the mpirun that --nproc-per-node starts"},
      {"FSDP_ALLOCATOR",
       T::kChoice,
       "auto",
       "host memory allocator of each rank: auto: jemalloc (libjemalloc.so.2, Debian's "
       "libjemalloc2) when installed, else the C library's malloc; jemalloc: require it; "
       "system: the C library's malloc (docs/troubleshooting.md \"Host memory grows\")",
       0,
       0,
       {"auto", "jemalloc", "system"}},
      {"LD_PRELOAD", T::kText, "unset",
       "libraries the dynamic loader loads first into each rank; the front puts jemalloc "
       "ahead of what it holds (FSDP_ALLOCATOR)"},
      {"FSDP_PRETEND_NODES", T::kInteger, "unset",
       "split the job into this many pretend nodes of contiguous ranks (hybrid sharding on one "
       "machine); must divide the number of ranks",
       1, 1 << 20},
      {"FSDP_MPI_RS_ALLREDUCE_BYTES", T::kInteger, "4194304",
       "MPI reduce-scatter inputs of at least this many bytes use Allreduce + slice (see "
       "comm-bench)",
       1, int64_t{1} << 62},
      {"FSDP_MPI_MAX_COUNT", T::kInteger, "2147483647",
       "largest element count per MPI call (tests lower it to exercise chunking)", 1, kInt32Max},
      {"FSDP_LAUNCHED", T::kPresence, "unset",
       "set to 1 by the launcher for the ranks it starts (a rank ignores --nproc-per-node)"},
      {"FSDP_RESTART_ATTEMPT", T::kInteger, "0",
       "set by the launcher: the restart attempt (0 for the first start)", 0, (1 << 30) - 1},
      {"FSDP_LAUNCH_ID", T::kText, "unset",
       "set by the launcher (kept when already set): the id of the launch, recorded in "
       "checkpoints so that restarts resume this launch's newest one"},
      {"OMPI_COMM_WORLD_SIZE", T::kPresence, "unset",
       "set by Open MPI's mpirun: this process is a rank under a launcher"},
      {"PMI_SIZE", T::kPresence, "unset", "set by PMI launchers (srun, MPICH): the same"},
      {"SLURM_STEP_ID", T::kPresence, "unset", "set by srun: the same"},
      {"FSDP_TEST_KILL_AT_STEP", T::kInteger, "-1",
       "tests only: rank FSDP_TEST_KILL_RANK kills itself (SIGKILL) after this optimizer step "
       "while the restart attempt is below FSDP_TEST_KILL_ATTEMPTS; -1: never",
       -1, (1 << 30) - 1},
      {"FSDP_TEST_KILL_RANK", T::kInteger, "0", "tests only: see FSDP_TEST_KILL_AT_STEP", 0,
       (1 << 30) - 1},
      {"FSDP_TEST_KILL_ATTEMPTS", T::kInteger, "1", "tests only: see FSDP_TEST_KILL_AT_STEP", 0,
       (1 << 30) - 1},
      {"FSDP_TEST_FAIL_WRITES_ON_RANK", T::kInteger, "unset",
       "tests only: every checkpoint state write of this world rank fails (the save-failure "
       "path)",
       0, (1 << 30) - 1},
  };
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

const char* type_text(const Variable& v) {
  switch (v.type) {
    case Type::kText:
      return "text";
    case Type::kPath:
      return "path";
    case Type::kInteger:
      return "integer";
    case Type::kChoice:
      return "choice";
    case Type::kPresence:
      return "set or unset";
  }
  return "";
}

// Values as they should appear in a message: short, on one line.
std::string shown(const std::string& value) {
  std::string s = value.size() > 40 ? value.substr(0, 40) + "..." : value;
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  }
  return s;
}

}  // namespace

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = build_table();
  return table;
}

const Variable& variable(std::string_view name) {
  for (const auto& v : variables()) {
    if (name == v.name) return v;
  }
  std::fprintf(stderr,
               "fsdp-train: environment variable %.*s is read but not in lib/core/env.cpp's "
               "table: a bug in fsdp-train, please report it\n",
               static_cast<int>(name.size()), name.data());
  std::abort();
}

std::optional<std::string> text(std::string_view name) {
  const char* v = std::getenv(variable(name).name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool is_set(std::string_view name) {
  return text(name).has_value();
}

std::optional<int64_t> parse_integer(std::string_view text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  // from_chars takes a '-' itself; a '+' may not be followed by another sign.
  if (digits.empty() ||
      (digits.size() < text.size() && !std::isdigit(static_cast<unsigned char>(digits.front())))) {
    return std::nullopt;
  }
  int64_t v = 0;
  const char* end = digits.data() + digits.size();
  const auto [p, ec] = std::from_chars(digits.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

Reading read(std::string_view name) {
  const Variable& row = variable(name);
  Reading r;
  const std::optional<std::string> value = text(name);
  if (row.type == Type::kInteger) {
    r.integer = parse_integer(row.default_text);
    if (!value) return r;
    const std::optional<int64_t> n = parse_integer(*value);
    if (n && *n >= row.min && *n <= row.max) {
      r.integer = n;
      return r;
    }
    std::ostringstream err, hint;
    err << row.name << "='" << shown(*value) << "' is not a whole number from " << row.min << " to "
        << row.max;
    hint << "unset " << row.name << " or give it a whole number from " << row.min << " to "
         << row.max << " (docs/usage.md, Environment variables)";
    r.error = err.str();
    r.hint = hint.str();
    return r;
  }
  r.text = value;
  if (row.type == Type::kChoice && value) {
    r.text = lower(*value);
    if (std::find(row.choices.begin(), row.choices.end(), *r.text) == row.choices.end()) {
      r.error =
          std::string(row.name) + "='" + shown(*value) + "' is not one of " + joined(row.choices);
      r.hint = std::string("unset ") + row.name + " or give one of " + joined(row.choices);
    }
  }
  return r;
}

std::string allocator_in_use() {
  // jemalloc's own entry point: present only when it is loaded.
  return ::dlsym(RTLD_DEFAULT, "mallctl") != nullptr ? "jemalloc" : "glibc malloc";
}

std::string usage_markdown() {
  std::ostringstream os;
  os << "| variable | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& v : variables()) {
    os << "| `" << v.name << "` | " << type_text(v);
    if (v.type == Type::kInteger) os << " " << v.min << ".." << v.max;
    if (v.type == Type::kChoice) os << ": " << joined(v.choices);
    os << " | " << v.default_text << " | " << v.meaning << " |\n";
  }
  return os.str();
}

}  // namespace fsdp::env
