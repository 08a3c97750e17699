"""The exec wrapper every `ChildProcess` starts through:

    python -I -S die_with_parent.py PARENT_PID SIGNAL PROGRAM [ARGS...]

asks the kernel to send SIGNAL to this process when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`,
which survives `execve`), checks the parent is still the one that started it (it may have died
before the request took effect), then replaces itself with PROGRAM.

Why a wrapper and not `subprocess.Popen(preexec_fn=...)`: a `preexec_fn` makes CPython start the
child with a plain `fork()` of the parent — a process that has gRPC threads running, whose fork
handlers may then corrupt the child's or the parent's gRPC state (CI once saw a child abort with
"epoll_wait error: Bad file descriptor" after "Other threads are currently calling into gRPC,
skipping fork() handlers"). Without `preexec_fn`, CPython starts children with `vfork()` + `exec`,
which runs no fork handlers and copies nothing; the one thing the child must do before the real
program starts is done here, in a fresh interpreter that has no threads. Standard library only,
`-I -S` (no site, no user paths): it starts in a few milliseconds.
"""

import os
import sys

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 125


def main(argv: list[str]) -> None:
    parent, signum, program = int(argv[1]), int(argv[2]), argv[3:]
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):        # not Linux/glibc: the parent's own stop() is all there is
        pass
    if os.getppid() != parent:               # the parent died before the request: do not start orphaned
        sys.exit(EXIT_PARENT_GONE)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
