# The bash side of an Outpost code context: one shell whose working
# directory, variables and functions last between runs. Each run is NUL-ended
# text on fd 3; its exit status leaves on fd 4 as a JSON line, after a marker
# on fds 1 and 2 that ends the run's output (see worker.py). The run's
# commands get neither fd 3 nor fd 4.
__outpost_mark=$OUTPOST_WORKER_MARK
unset OUTPOST_WORKER_MARK OUTPOST_VENV
# An interrupt stops the foreground command; the shell and its state stay.
trap : INT
printf '{"ready":true,"pid":%d,"version":"%s"}\n' "$$" "$BASH_VERSION" >&4
while :; do
    IFS= read -r -d '' __outpost_run <&3
    __outpost_status=$?
    # Above 128: a late interrupt hit the read, not a run.
    [ "$__outpost_status" -gt 128 ] && continue
    # Otherwise nonzero: the daemon is gone, and so is the context.
    [ "$__outpost_status" -eq 0 ] || exit 0
    eval "$__outpost_run" 3<&- 4>&-
    __outpost_status=$?
    printf '%s' "$__outpost_mark"
    printf '%s' "$__outpost_mark" >&2
    printf '{"exit_code":%d}\n' "$__outpost_status" >&4
done
