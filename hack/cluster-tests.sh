#!/usr/bin/env bash
# The cluster tests (tests/cluster, marker `cluster`) on the test cluster that is up now
# (hack/cluster-up.sh), in the order and streams .ci/run uses:
#
#   hack/cluster-tests.sh          every cluster test: all but KFP's in one stream, then KFP's
#   hack/cluster-tests.sh kfp      KFP's only, in two streams (.ci/run's stage 3, which runs
#                                  beside its stage 2: side by side they fit, measured there)
#
# KFP's tests run in two streams: the UI's and the recurring run's (about 650 and 250 s warm)
# beside the API's others (about 900 s); measured 2026-11-27, 652 s beside 1118 s where one after
# the other took 1760 s. Their step pods ask for a tenth of a CPU, so two runs fit this 2-core
# node's requests. The other tests stay in one stream: their job pods ask for a quarter CPU each,
# and two streams of them (Katib's trials beside a TrainJob's nodes) do not fit (tried: pods stayed
# Pending on "Insufficient cpu" and the tests timed out). With a tenth of a CPU each they fit, but
# their CPU shares then lose to the host's processes beside them (tried 2026-11-27 in CI: a Katib
# trial's master failed and the median-rule test ran past its 600 s).
#
# The UI stream's output goes to ${GPUPIPE_TEST_LOGS}/kfp-ui-tests.log (default a temporary
# folder) and is printed when both streams are done. Exit 1 when any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-all}"
case "$what" in
  all | kfp) ;;
  *)
    echo "hack/cluster-tests.sh: unknown selection '$what' (use 'all' or 'kfp')" >&2
    exit 2
    ;;
esac
pytest=(.venv/bin/pytest -m cluster -p no:cacheprovider)
logs="${GPUPIPE_TEST_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpupipe-cluster-tests.XXXXXX")}"
mkdir -p "$logs"
rc=0
t0=$SECONDS

if [[ "$what" == all ]]; then
  "${pytest[@]}" tests/cluster -k "not kfp" --durations=15 || rc=1
  printf ">> the cluster tests but KFP's done in %d s\n" "$((SECONDS - t0))"
fi

t1=$SECONDS
schedule="tests/cluster/test_kfp.py::test_a_schedule_really_starts_a_run_and_is_updated_disabled_enabled_and_deleted"
"${pytest[@]}" tests/cluster/test_kfp_ui.py "$schedule" --durations=8 \
  >"${logs}/kfp-ui-tests.log" 2>&1 &
ui_tests=$!
# Stopped with this script (Ctrl-C, or .ci/run's process group killed).
trap 'kill "$ui_tests" 2>/dev/null || true' EXIT
"${pytest[@]}" tests/cluster -k kfp --ignore tests/cluster/test_kfp_ui.py --deselect "$schedule" \
  --durations=10 || rc=1
wait "$ui_tests" || rc=1
trap - EXIT
echo ">> the KFP UI's tests and the schedule's (beside the above; ${logs}/kfp-ui-tests.log):"
cat "${logs}/kfp-ui-tests.log"
printf ">> KFP's tests (two streams) done in %d s (total %d s)\n" "$((SECONDS - t1))" "$((SECONDS - t0))"
exit "$rc"
