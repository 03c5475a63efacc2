#!/usr/bin/env bash
# Host processes of the test cluster: start one in the background with its pid and log in the
# state folder, tell whether it runs, stop it. Sourced by hack/cluster-up.sh and cluster-down.sh.

# running NAME: its pid file names a live process.
running() {
  local pid
  pid="$(cat "${RUN_DIR}/$1.pid" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && ours "$pid"
}

# ours PID: the process is one this cluster started (its command line names the cluster's binaries
# or state folder), not another that got the pid of one that ended.
ours() {
  local cmd
  cmd="$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"${BIN_DIR}/"* || "$cmd" == *"${STATE}/"* ]]
}

# argv0 PID: the first word of the process's command line (empty while the kernel swaps its image
# in an exec, or once it ended).
argv0() {
  local first=""
  IFS= read -r -d '' first <"/proc/$1/cmdline" 2>/dev/null || true
  printf '%s' "$first"
}

# start NAME COMMAND...: run it in its own session (it outlives this shell), log to logs/NAME.log.
# Does nothing when NAME already runs. Returns once the child runs COMMAND, or has ended: until
# then it is this shell's fork, then `setsid COMMAND...`, then COMMAND, so its first word is read
# until it is COMMAND's (or, for a command that re-executes itself, anything but empty, setsid or
# this shell's). Returning earlier let must_run read the command line mid-exec, empty, and stop
# the cluster with "exited at start" while the process ran (kube-router, twice). The wait is by
# the clock, START_WAIT_S (default 120) seconds, then one line and status 1: under a cold
# .ci/run's load a niced shell's child can wait many seconds for its exec.
start() {
  local name="$1" wait_s="${START_WAIT_S:-120}" pid deadline first self
  shift
  running "$name" && return 0
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  self="$(argv0 "$$")"
  setsid "$@" >>"${LOG_DIR}/${name}.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"${RUN_DIR}/${name}.pid"
  deadline=$((SECONDS + wait_s))
  while ((SECONDS < deadline)); do
    first="$(argv0 "$pid")"
    [[ "$first" == "$1" ]] && return 0
    [[ -n "$first" && "$first" != setsid && "$first" != "$self" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
  printf 'error: cluster: %s (pid %s) did not start %s within %d s\n' "$name" "$pid" "$1" "$wait_s" >&2
  return 1
}

# why_not_running NAME: what became of NAME's process, for must_run's line: its exit status or
# signal (`wait` knows it when this shell started it), or what runs under its pid instead.
why_not_running() {
  local pid pstate status=0
  pid="$(cat "${RUN_DIR}/$1.pid" 2>/dev/null)" || { printf 'no pid file'; return 0; }
  pstate="$(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null)" || pstate=""
  if [[ -n "$pstate" && "$pstate" != Z ]]; then
    printf 'pid %s runs: %.120s' "$pid" "$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null)"
    return 0
  fi
  wait "$pid" 2>/dev/null || status=$?
  if ((status == 127)); then
    printf 'pid %s ended (not a child of this shell: no exit status)' "$pid"
  elif ((status > 128)); then
    printf 'killed by signal %d (%s)' "$((status - 128))" "$(kill -l "$((status - 128))" 2>/dev/null)"
  else
    printf 'exit status %d' "$status"
  fi
}

# log_tail NAME: the last lines of NAME's log on stderr, or a line saying it is empty.
log_tail() {
  local log="${LOG_DIR}/$1.log"
  if [[ -s "$log" ]]; then
    tail -n 5 "$log" >&2
  else
    echo "    (${log} is empty)" >&2
  fi
}

# stop NAME: SIGTERM, then SIGKILL after 15 s; removes the pid file.
stop() {
  local name="$1" pid i
  pid="$(cat "${RUN_DIR}/${name}.pid" 2>/dev/null)" || return 0
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "${RUN_DIR}/${name}.pid"
}

# must_run NAME SECONDS CHECK...: wait for CHECK to pass while NAME runs; else one line + its log.
must_run() {
  local name="$1" limit="$2" start_s=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! running "$name"; then
      # One read is not believed: a process that re-executes itself has, for a moment, no
      # command line. An ended one is still not running half a second on, and has written its
      # last lines by then.
      sleep 0.5
      if ! running "$name"; then
        log_tail "$name"
        die "${name} exited at start, $(why_not_running "$name") (log: ${LOG_DIR}/${name}.log)"
      fi
    fi
    if ((SECONDS - start_s > limit)); then
      log_tail "$name"
      die "${name} not ready within ${limit} s (log: ${LOG_DIR}/${name}.log)"
    fi
    sleep 0.5
  done
}
