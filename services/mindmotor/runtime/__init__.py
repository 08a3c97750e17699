"""What runs and supervises processes, for any service that starts others (`mindmotor up`, the
Deployer's local replicas, `mindmotor coordinator --replicas`, the structured-output helper pools).

    child_command.py    a program behind the exec wrapper (die_with_parent.py): it dies with its parent
    child_process.py    `ChildProcess`: a service started as a child, ready at its ready line
    detached_process.py `DetachedProcess`: one that outlives its starter (its anchor adopts it)
    subreaper.py        a child subreaper, and the reaping of what it adopts
    proc_tree.py        a process's descendants, read from /proc
    supervisor.py       `Supervisor`: services restarted when they die or stop answering
    supervisor_metrics.py   what a supervisor counts (restarts, deaths, liveness kills)
    liveness.py         `LivenessProbe`: an HTTP endpoint answered, or not
    backoff.py          `RestartBackoff`: the wait before a restart, doubling with quick deaths

It imports no other MindMotor package (tests/test_package_graph.py): what it starts is named by
command lines, never by imports.
"""
