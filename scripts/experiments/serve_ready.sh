# Sourced by the experiment scripts that time a server's start (time_to_ready.sh, real_shape_serve.sh):
#   start_server LOG PORT [serve args...]   `tailgate serve --port PORT ...` in its own process group,
#                                            output to LOG; returns once /health answers 200 (SERVER_PID
#                                            set), or prints LOG's tail and returns 1 if it exits first
#   stop_server                              SIGTERM to that process group, then wait for it
start_server() {
  local log=$1 port=$2
  shift 2
  setsid .venv/bin/tailgate serve --port "$port" "$@" > "$log" 2>&1 &
  SERVER_PID=$!
  until curl -sf "localhost:$port/health" >/dev/null; do
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited; its log ($log):"; tail -20 "$log"; return 1; }
    sleep 0.1
  done
}

stop_server() {
  kill -TERM -- "-$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
}
