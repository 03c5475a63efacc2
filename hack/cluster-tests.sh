#!/usr/bin/env bash
# The cluster tests (tests/cluster, marker `cluster`) on the test cluster that is up now
# (hack/cluster-up.sh), in the order and streams .ci/run uses:
#
#   hack/cluster-tests.sh          every cluster test: all but KFP's in one stream, then KFP's
#   hack/cluster-tests.sh kfp      KFP's only, in three streams (.ci/run's stage 3, which runs
#                                  beside its stage 2 once its foreground is done)
#
# KFP's tests run in three streams: the API's (whole runs with PyTorchJobs, the cache, a
# failure, terminate), the UI's, and the side stream's (the schedule's, the retry's, the refusal's
# and the big table's). In two (the schedule's with the UI's), the API's was the longer (about
# 1600 s cold, 2026-11-29) and ended the cold .ci/run. Their step pods ask for a twentieth of a
# CPU, a PyTorchJob's two pods a tenth each: the three streams' jobs fit together beside the
# cluster's own requests (1014m of 2000m). At a quarter they did not, and jobs that each got one
# pod waited on each other (both terminate tests, 900 s, in 14da96b's CI:
# tests/cluster/test_kfp.py's JOB_SETTINGS).
# The other tests stay in one stream: their job pods ask for a quarter CPU each,
# and two streams of them (Katib's trials beside a TrainJob's nodes) do not fit (tried: pods stayed
# Pending on "Insufficient cpu" and the tests timed out). With a tenth of a CPU each they fit, but
# their CPU shares then lose to the host's processes beside them (tried 2026-11-27 in CI: a Katib
# trial's master failed and the median-rule test ran past its 600 s).
#
# The two streams beside the API's write to ${GPUPIPE_TEST_LOGS}/kfp-ui-tests.log and
# kfp-side-tests.log (default a temporary folder), printed when all three are done. Exit 1 when
# any test failed.
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
kfp_api=tests/cluster/test_kfp.py
side=(
  "${kfp_api}::test_a_schedule_really_starts_a_run_and_is_updated_disabled_enabled_and_deleted"
  "${kfp_api}::test_a_deleted_train_step_pod_is_retried_and_re_attaches_to_its_job"
  "${kfp_api}::test_a_train_step_that_refuses_its_input_runs_once"
  "${kfp_api}::test_a_table_larger_than_the_preprocess_pods_memory_limit_goes_through"
)
"${pytest[@]}" tests/cluster/test_kfp_ui.py --durations=8 >"${logs}/kfp-ui-tests.log" 2>&1 &
ui_tests=$!
"${pytest[@]}" "${side[@]}" --durations=3 >"${logs}/kfp-side-tests.log" 2>&1 &
side_tests=$!
# Stopped with this script (Ctrl-C, or .ci/run's process group killed).
trap 'kill "$ui_tests" "$side_tests" 2>/dev/null || true' EXIT
# Stops a node under a KFP run: alone after the three streams (a lost node takes every pod on
# it down, another stream's too); with `kfp`, left to the caller.
node_loss="${kfp_api}::test_a_node_lost_under_the_pipelines_job_and_back_the_run_still_succeeds"
deselect=(--deselect "$node_loss")
for test in "${side[@]}"; do deselect+=(--deselect "$test"); done
"${pytest[@]}" tests/cluster -k kfp --ignore tests/cluster/test_kfp_ui.py "${deselect[@]}" \
  --durations=10 || rc=1
wait "$ui_tests" || rc=1
wait "$side_tests" || rc=1
trap - EXIT
# (.ci/run's stage 3, `kfp`, runs beside its stage 2: .ci/run runs this one once both are done.)
if [[ "$what" == all ]]; then "${pytest[@]}" "$node_loss" || rc=1; fi
echo ">> the KFP UI's tests (beside the above; ${logs}/kfp-ui-tests.log):"
cat "${logs}/kfp-ui-tests.log"
echo ">> the schedule's, the retry's, the refusal's and the big table's (beside the above; ${logs}/kfp-side-tests.log):"
cat "${logs}/kfp-side-tests.log"
printf ">> KFP's tests (three streams) done in %d s (total %d s)\n" "$((SECONDS - t1))" "$((SECONDS - t0))"
exit "$rc"
