#!/usr/bin/env bash
# lint.no_outside_refs: the repository documents itself and its scripts cannot flake on a pipe.
# Fails on (1) references to documents outside the repository or to one machine's absolute paths
# in docs/, lib/, apps/, tests/ and the top-level pages, and (2) a producer piped into an
# early-exiting reader (`| grep -q`, `| head`, ...) in the shell scripts of tests/, launch/ and
# benchmarks/: under `set -o pipefail` the producer can die of SIGPIPE and fail the pipeline.
# Usage: no_outside_refs.sh [REPO_ROOT]. It first checks itself on planted violations.
set -uo pipefail
ROOT="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
SELF="no_outside_refs.sh"

# Documents that live outside the repository, and citations of them ("spec 3.2"): cite
# docs/reference.md §N instead. Absolute paths of a machine: say what the path is relative to.
OUTSIDE='style\.md|design\.md|(^|[^a-z_])shared/|/shared\b|spec/eagle3|eagle3-offline\.md|\bspec (section )?[0-9]'
ABSOLUTE='(^|[^A-Za-z0-9_.~$}-])/(work|root|home|Users)/'
# A reader that may exit before its producer has written everything.
EARLY_EXIT='\|[[:space:]]*(grep([[:space:]]+-[^[:space:]]+)*[[:space:]]+(-[A-Za-z]*[qm]|--quiet|--max-count)|head\b|sed[[:space:]]+-n[[:space:]]+[0-9]+q)'

# scan DIR-ROOT: prints every violation as "file:line: what"; returns 1 when there is one.
scan() {
  local root="$1" bad=0 hits
  local -a text_dirs=() script_dirs=()
  for d in docs lib apps tests README.md CHANGELOG.md; do [ -e "$root/$d" ] && text_dirs+=("$root/$d"); done
  for d in tests launch benchmarks; do [ -e "$root/$d" ] && script_dirs+=("$root/$d"); done
  [ ${#text_dirs[@]} -gt 0 ] || return 0
  hits="$(grep -rnIE --exclude="$SELF" -- "$OUTSIDE" "${text_dirs[@]}")"
  if [ -n "$hits" ]; then
    bad=1
    sed 's/$/   <- refers to a file outside the repository: cite docs\/reference.md §N or an in-repo page/' <<<"$hits"
  fi
  hits="$(grep -rnIE --exclude="$SELF" -- "$ABSOLUTE" "${text_dirs[@]}")"
  if [ -n "$hits" ]; then
    bad=1
    sed 's/$/   <- absolute path of one machine: use a path relative to the repository or $HOME/' <<<"$hits"
  fi
  if [ ${#script_dirs[@]} -gt 0 ]; then
    # Comment lines are skipped: they may name the pattern to explain why it is avoided.
    hits="$(grep -rnIE --include='*.sh' --include='*.sbatch' --exclude="$SELF" -- "$EARLY_EXIT" \
      "${script_dirs[@]}" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*#')"
    if [ -n "$hits" ]; then
      bad=1
      sed 's/$/   <- producer | early-exiting reader: use grep -q PATTERN <<<"$var" or grep -c/' <<<"$hits"
    fi
  fi
  return $bad
}

# Self-check: each planted violation must be found, a clean tree must pass.
plant="$(mktemp -d)"
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant/docs" "$plant/lib" "$plant/tests/e2e" "$plant/launch"
echo "fine: see docs/reference.md §3.2, /usr/local/cuda, ~/.cache/fsdp-train, qwen3-8b-eagle3-offline.yaml" >"$plant/docs/ok.md"
echo 'ok="$(ls | grep -c x)"; grep -q x <<<"$ok"' >"$plant/tests/e2e/ok.sh"
scan "$plant" >/dev/null || { echo "FAIL: the self-check flags a clean tree:"; scan "$plant"; exit 1; }
n=0
for planted in "docs/a.md:as ../shared/style.md says" "lib/b.h:// (design.md section 4)" \
  "lib/c.cpp:// the unroll (spec 3.2)" "docs/c2.md:see the /shared design notes" "docs/d.md:data in /work/shared/spec/eagle3-offline.md" \
  "docs/d2.md:as eagle3-offline.md says" \
  "docs/e.md:run /root/venv/bin/python" "tests/f.cpp:// from /home/me/x" \
  'tests/e2e/g.sh:echo "$out" | grep -q "2 ranks" || fail' 'launch/h.sh:x="$(ls d | head -n 1)"' \
  'tests/e2e/i.sh:"$BIN" --version | grep -Eq "^fsdp" || fail'; do
  n=$((n + 1))
  rm -rf "$plant/case" && mkdir -p "$plant/case" && cp -r "$plant/docs" "$plant/tests" "$plant/case/"
  file="${planted%%:*}"
  mkdir -p "$(dirname "$plant/case/$file")"
  echo "${planted#*:}" >"$plant/case/$file"
  if scan "$plant/case" >/dev/null; then
    echo "FAIL: the self-check missed planted violation $n ($file: ${planted#*:})"
    exit 1
  fi
done

scan "$ROOT" && { echo "PASS: no outside references, no machine paths, no early-exit pipes"; exit 0; }
echo "FAIL: see the lines above"
exit 1
