#!/usr/bin/env bash
# The README's "Quick start", run as written, from the root of a clone: install, `mindmotor up`, a
# completion, `mindmotor train --preset quick`, that checkpoint rolled out as a canary of the running
# `up`'s deployment, promoted, served. Exit 0 when every step worked; the first failing step stops it
# (its output, and up's log, are printed).
#
#   bash scripts/quickstart_check.sh
#
# The commands are the README's, character for character (tests/e2e/test_quickstart.py checks it;
# the curl's URL is the one `up` printed, 127.0.0.1:8000 unless MINDMOTOR_PORT says otherwise); what
# the environment may change around them (tests/e2e/test_quickstart.py sets these):
#   QUICKSTART_SKIP_INSTALL=1     .venv is there already (CI has just run scripts/install.sh dev)
#   QUICKSTART_TRAIN_ARGS="..."   appended to the train command (CI: a few steps on a small corpus;
#                                 the preset itself takes ~2-3 min on 2 cores)
#   MINDMOTOR_STATE_DIR, MINDMOTOR_PORT   where this `up` keeps its state, its API port (0: a free one)
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d -t mindmotor-quickstart-XXXXXX)
up_pid=""
cleanup() {
  status=$?
  if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
    kill -INT "$up_pid"                       # Ctrl-C: drain and stop
    wait "$up_pid" || true
  fi
  if [ "$status" -ne 0 ]; then
    echo "quickstart check FAILED (exit $status); up's output:" >&2
    tail -n 40 "$work/up.out" "$work/up.err" >&2 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
step() { echo "== $(date +%T) $*"; }
before_tmp=$(ls -d /tmp/mindmotor-up-* 2>/dev/null | sort || true)

step "install"
if [ -z "${QUICKSTART_SKIP_INSTALL:-}" ]; then
  bash scripts/install.sh dev
fi

step "mindmotor up"
.venv/bin/mindmotor up >"$work/up.out" 2>"$work/up.err" &
up_pid=$!
for _ in $(seq 600); do
  grep -q '^MINDMOTOR_UP_READY' "$work/up.out" && break
  kill -0 "$up_pid" 2>/dev/null || { echo "mindmotor up exited before it was ready" >&2; exit 1; }
  sleep 0.5
done
url=$(sed -n 's/^MINDMOTOR_UP_READY url=\([^ ]*\).*/\1/p' "$work/up.out")
[ -n "$url" ] || { echo "mindmotor up was not ready in 300 s" >&2; exit 1; }

step "a completion"
curl -sf "$url"/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "mindmotor-demo", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}' \
  | tee "$work/completion.json"
echo
grep -q '"finish_reason"' "$work/completion.json"

step "mindmotor train --preset quick"
# shellcheck disable=SC2086  # QUICKSTART_TRAIN_ARGS is a list of flags
.venv/bin/mindmotor train --preset quick --tokenizer-from services/mindmotor/assets/mindmotor-demo --run-name quick ${QUICKSTART_TRAIN_ARGS:-}

step "canary"
.venv/bin/mindmotor deploy rollout mindmotor-demo --version quick --checkpoint "$(ls -d checkpoints/quick-step* | tail -1)" --canary 10

step "promote"
.venv/bin/mindmotor deploy promote mindmotor-demo
.venv/bin/mindmotor deploy get mindmotor-demo --json >"$work/deployment.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["spec"]["traffic"] == {"quick": 100.0}, d["spec"]' \
  "$work/deployment.json"
curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "mindmotor-demo", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}' >/dev/null

step "Ctrl-C"
kill -INT "$up_pid"
wait "$up_pid"                                 # exit 0: drained and stopped
up_pid=""
after_tmp=$(ls -d /tmp/mindmotor-up-* 2>/dev/null | sort || true)
[ "$before_tmp" = "$after_tmp" ] || { echo "temporary directories left: $after_tmp" >&2; exit 1; }
echo "quickstart check passed"
