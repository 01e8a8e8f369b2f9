# The bash side of an Outpost code context: one shell whose working
# directory, variables and functions last between runs. Each run is three
# NUL-ended texts on fd 3 — what sets the run's environment, the run, what
# puts the environment back — and its exit status leaves on fd 4 as a JSON
# line, after run N's marker on fds 1 and 2 that ends its output (see
# worker.py). The run's commands get neither fd 3 nor fd 4. The worker's own
# commands go through `builtin`, so a function the run defines (`printf`,
# `read`) cannot take them over.
__outpost_mark=$OUTPOST_WORKER_MARK
__outpost_n=0
unset OUTPOST_WORKER_MARK OUTPOST_VENV
# Run N is over: its marker on both streams, then its answer.
__outpost_answer() {
    builtin printf '%s%d.' "$__outpost_mark" "$__outpost_n"
    builtin printf '%s%d.' "$__outpost_mark" "$__outpost_n" >&2
    builtin printf '{"exit_code":%d%s}\n' "$1" "$2" >&4
}
# A run that ends the shell (`exit`, `set -e`) still gets its answer.
builtin trap '__outpost_answer "$?" ",\"exited\":true"' EXIT
# One NUL-ended text from fd 3 into $1. Nonzero: the daemon is gone.
__outpost_read() {
    while :; do
        IFS= builtin read -r -d '' "$1" <&3
        __outpost_status=$?
        # Above 128: a late interrupt hit the read, not a run.
        [ "$__outpost_status" -gt 128 ] || return "$__outpost_status"
    done
}
builtin printf '{"ready":true,"pid":%d,"version":"%s"}\n' "$$" "$BASH_VERSION" >&4
while :; do
    # An interrupt stops a run's foreground command; between runs there is
    # nothing to stop.
    builtin trap '' INT
    if ! { __outpost_read __outpost_setup && __outpost_read __outpost_run && __outpost_read __outpost_restore; }; then
        builtin trap - EXIT
        builtin exit 0
    fi
    __outpost_n=$((__outpost_n + 1))
    builtin eval "$__outpost_setup"
    builtin trap : INT
    builtin eval "$__outpost_run" 3<&- 4>&-
    __outpost_status=$?
    builtin trap '' INT
    builtin eval "$__outpost_restore"
    __outpost_answer "$__outpost_status" ""
done
