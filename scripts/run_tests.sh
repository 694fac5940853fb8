#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes that run at the same time.
#
#   session-ray  the tests on the session's one local Ray (tests/conftest.py marks every test
#                that uses the `ray_session` fixture `session_ray`), one after another
#   other        every other test: the unit tier, and the e2e tests that start their own
#                processes or clusters (the kill -9 scenarios, the 2-node cluster, servers)
#
# On 2 cores neither keeps both busy alone: a test on Ray waits on actor and process start-ups,
# a kill -9 scenario on its own cold Ray. The other stream's Rays get a temporary folder of their
# own (RAY_TMPDIR), so a `dynlm` it starts never joins the session's Ray nor rewrites its address
# file. The other stream prints as it goes; the session-ray stream writes to a log file that is
# printed (and followed) when the other stream ends. Each prints its 25 slowest tests. The exit
# status is the first stream's that failed (pytest's 5, "no test selected", counts as passed:
# PYTEST_ARGS may pick tests of one stream only). Both get the arguments given to this script.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs/logs
log=runs/logs/tests-session-ray.log
other_ray_tmp=$(mktemp -d "${TMPDIR:-/tmp}/dynlm-tests-ray.XXXXXX")  # short: Ray's socket paths

DYNLM_TEST_STREAM=session-ray "$PY" -m pytest -q -m session_ray --durations=25 "$@" >"$log" 2>&1 &
ray_stream=$!
echo "[tests] the session-ray stream runs beside this one (pid $ray_stream); its output: $log"
echo "[tests] == the other tests (unit tier; e2e tests with their own processes) =="
DYNLM_TEST_STREAM=other RAY_TMPDIR=$other_ray_tmp nice -n "${OTHER_STREAM_NICE:-10}" \
  "$PY" -m pytest -q -m "not session_ray" --durations=25 "$@"
other_status=$?
echo "[tests] == the tests on the session's Ray ($log) =="
tail -n +1 -f --pid="$ray_stream" "$log"
wait "$ray_stream"
ray_status=$?
rm -rf "$other_ray_tmp"

passed() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
echo "[tests] other tests: exit $other_status; tests on the session's Ray: exit $ray_status"
if ! passed "$other_status"; then exit "$other_status"; fi
if ! passed "$ray_status"; then exit "$ray_status"; fi
exit 0
