#!/usr/bin/env bash
# Fuzz the REST API from its own OpenAPI schema against a real ASGI server on a scratch
# PostgreSQL database, authenticated as an operator. Fails on any 5xx or schema violation.
# Revoking tokens is left out: the fuzzer would revoke its own and test the rest logged out
# (tests/api/test_tokens.py covers it).
set -euo pipefail
PG_URL=$1
REDIS_URL=$2
BIN=.venv/bin
DB=fleet_schemathesis
WORK=$(mktemp -d)
PORT=${FLEET_CI_PORT:-8765}
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
export FLEET_DATABASE_URL=${PG_URL%/*}/$DB FLEET_REDIS_URL=$REDIS_URL
export FLEET_MODE=production FLEET_SECRET_KEY=ci-only-secret FLEET_ALLOWED_HOSTS=127.0.0.1 FLEET_SECURE_COOKIES=false
export FLEET_SECRETS_KEY=Y2ktb25seS1mZXJuZXQta2V5LW5vdC1mb3ItdXNlLSE=
# One token sends thousands of requests a minute here: throttled answers (429) would only stop
# the fuzzer from reaching the code. Per second, so that each throttle's history stays short.
for scope in USER AGENT ANON ENROLL MIG EXPENSIVE; do export "FLEET_THROTTLE_$scope=1000/s"; done
$BIN/python manage.py migrate -v0
$BIN/python manage.py collectstatic --noinput -v0
$BIN/python manage.py demo --no-serve >/dev/null
TOKEN=$($BIN/python manage.py create_api_token schemathesis --role operator)
$BIN/python manage.py spectacular --file "$WORK/schema.yaml"
$BIN/daphne -b 127.0.0.1 -p "$PORT" fleet.asgi:application >"$WORK/daphne.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.5; done
status=0
$BIN/schemathesis run "$WORK/schema.yaml" --url "http://127.0.0.1:$PORT" \
  -H "Authorization: Token $TOKEN" \
  --exclude-operation-id tokens_destroy \
  --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
  --phases examples,coverage,fuzzing --max-examples "${FLEET_CI_MAX_EXAMPLES:-25}" \
  --workers 1 --suppress-health-check all ${FLEET_CI_SCHEMATHESIS_ARGS:-} || status=$?
if [ $status -ne 0 ]; then
  echo "---- daphne log (tail) ----"; tail -n 80 "$WORK/daphne.log"
fi
exit $status
