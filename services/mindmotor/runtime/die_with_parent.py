"""The exec wrapper every `ChildProcess` starts through:

    python -I -S die_with_parent.py PARENT_PID SIGNAL PROGRAM [ARGS...]

asks the kernel to send SIGNAL to this process when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`,
which survives `execve`), checks the parent is still the one that started it (it may have died
before the request took effect), leaves its parent's process group for one of its own (a terminal's
Ctrl-C then reaches the supervisor alone, which stops its children in order), then replaces itself
with PROGRAM.

    python -I -S die_with_parent.py --detach ANCHOR_PID SIGNAL STDOUT_PATH PROGRAM [ARGS...]

starts PROGRAM as a process that does not belong to its starter: the wrapper forks once more,
prints the new process's pid on stdout and exits; the new process, orphaned, is adopted by the
nearest "child subreaper" among its ancestors (`prctl(PR_SET_CHILD_SUBREAPER)`: `mindmotor up`, or
a standalone deployer itself), checks that this is ANCHOR_PID (else exits 125), asks for SIGNAL
when the anchor dies, sends its stdout to STDOUT_PATH (a file: nobody holds a pipe it could
break) and replaces itself with PROGRAM. This is how a Deployer's local replicas outlive a
Deployer that dies under `up` (the restarted one adopts them), yet die with `up`.

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
REPARENT_WAIT_S = 5.0


def _death_signal(signum: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):        # not Linux/glibc: the parent's own stop() is all there is
        pass


def _own_process_group() -> None:
    """A process group of its own: a terminal's Ctrl-C (SIGINT to its foreground process group)
    reaches the supervisor alone, which then stops its children in order (coordinators finish
    their streams first) instead of every process getting the signal at once."""
    try:
        os.setpgid(0, 0)
    except OSError:                          # already a group or session leader
        pass


def main(argv: list[str]) -> None:
    if argv[1] == "--detach":
        return detach(int(argv[2]), int(argv[3]), argv[4], argv[5:])
    parent, signum, program = int(argv[1]), int(argv[2]), argv[3:]
    _own_process_group()
    _death_signal(signum)
    if os.getppid() != parent:               # the parent died before the request: do not start orphaned
        sys.exit(EXIT_PARENT_GONE)
    os.execvp(program[0], program)


def detach(anchor: int, signum: int, stdout_path: str, program: list[str]) -> None:
    import time

    starter = os.getpid()
    pid = os.fork()                          # a fresh interpreter with one thread: a plain fork is safe
    if pid:
        os.write(1, f"{pid}\n".encode())
        os._exit(0)
    deadline = time.monotonic() + REPARENT_WAIT_S
    while os.getppid() == starter and time.monotonic() < deadline:
        time.sleep(0.001)                    # until the starter has exited and we are adopted
    _own_process_group()
    _death_signal(signum)
    if os.getppid() != anchor:               # the anchor is gone, or is no subreaper: do not run unowned
        os._exit(EXIT_PARENT_GONE)
    out = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.close(out)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv)
