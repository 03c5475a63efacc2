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

# start NAME COMMAND...: run it in its own session (it outlives this shell), log to logs/NAME.log.
# Does nothing when NAME already runs.
start() {
  local name="$1"
  shift
  running "$name" && return 0
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  setsid "$@" >>"${LOG_DIR}/${name}.log" 2>&1 </dev/null &
  echo $! >"${RUN_DIR}/${name}.pid"
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
      tail -n 5 "${LOG_DIR}/${name}.log" >&2 || true
      die "${name} exited at start (log: ${LOG_DIR}/${name}.log)"
    fi
    if ((SECONDS - start_s > limit)); then
      tail -n 5 "${LOG_DIR}/${name}.log" >&2 || true
      die "${name} not ready within ${limit} s (log: ${LOG_DIR}/${name}.log)"
    fi
    sleep 0.5
  done
}
