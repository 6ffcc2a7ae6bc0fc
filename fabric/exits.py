"""The CLI's exit codes, one meaning each (docs/operations/running.md lists them)."""

RET_OK, RET_FAILED, RET_USAGE, RET_CONNECT, RET_JOB_FAILED = 0, 1, 2, 3, 4
RET_NOT_FOUND, RET_CANCELLED, RET_NO_NODES = 5, 6, 7
# As a shell reports a command stopped by SIGINT or SIGPIPE (128 + the signal's number).
RET_INTERRUPTED, RET_BROKEN_PIPE = 130, 141
