#!/usr/bin/env bash
# `make run`: the FastAPI example alone under `forgezero-lifecycle serve`, with a fresh token and
# the commands to drive it printed first. Ctrl-C (SIGINT) drains it and exits.
set -euo pipefail
BIN=${BIN:-.venv/bin}
PORT=${PORT:-8000}
new_secret() { "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))'; }
export FORGEZERO_CONTROL_TOKEN=${FORGEZERO_CONTROL_TOKEN:-$(new_secret)}
export FORGEZERO_REVISION=${FORGEZERO_REVISION:-$(git rev-parse HEAD 2>/dev/null || printf '%040d' 0)}
NONCE=$(new_secret)
cat <<TEXT
Serving examples/fastapi_app on http://127.0.0.1:$PORT (revision $FORGEZERO_REVISION).
In another terminal:

  export FORGEZERO_CONTROL_TOKEN=$FORGEZERO_CONTROL_TOKEN
  curl -s localhost:$PORT/hello
  curl -si localhost:$PORT/.forgezero/runtime/ready
  curl -s -X POST localhost:$PORT/.forgezero/runtime/drain/v1/begin \\
    -H "Authorization: Bearer \$FORGEZERO_CONTROL_TOKEN" -H 'Content-Type: application/json' \\
    -d '{"protocol":"forgezero-drain/v1","nonce":"$NONCE","sourceRevision":"$FORGEZERO_REVISION","targetRevision":"$(printf 'f%.0s' {1..40})","timeoutMs":30000}'
  curl -s "localhost:$PORT/.forgezero/runtime/drain/v1/status?nonce=$NONCE" \\
    -H "Authorization: Bearer \$FORGEZERO_CONTROL_TOKEN"
  curl -s -X POST localhost:$PORT/.forgezero/runtime/drain/v1/rollback \\
    -H "Authorization: Bearer \$FORGEZERO_CONTROL_TOKEN" -H 'Content-Type: application/json' \\
    -d '{"nonce":"$NONCE"}'

Or with the CLI:  $BIN/forgezero-lifecycle drain --url http://127.0.0.1:$PORT \\
                    --source-revision $FORGEZERO_REVISION --target-revision $(printf 'f%.0s' {1..40}) --timeout 30s

Ctrl-C drains this generation (readiness off, in-flight work finishes) and exits.
TEXT
exec "$BIN/forgezero-lifecycle" serve examples.fastapi_app.app:app \
  --port "$PORT" --revision "$FORGEZERO_REVISION" --drain-timeout 30s
