"""The Deployer: deployment specs turned into running workers, traffic weights between versions,
canary rollouts and rollbacks.

    mindmotor deploy ── gRPC Deployer ── Deployments (operations) ── DeploymentStore (a Store)
                                                                          │  read every pass
    backend (local processes | Kubernetes) ◀── scale / restart / remove ── Reconciler
    controller ◀── SetTraffic ── Reconciler ──▶ Watch: which replicas are ready, which weights held

Modules: `spec` (the spec file, validation, checkpoint verification) and `worker_settings`
(`worker:` flags checked against the worker's command line), `records` and `store` (the desired
state), `operations` (what each call means), `rollout` (a rollout's steps), `reconcile` (the loop;
its restarts wait by `runtime.backoff`), `controller_link` (Watch + SetTraffic), `backends/`
(`local`, whose replicas are `runtime.detached_process`es, `kubernetes` with `manifests` and
`kube_api`), `service` (gRPC) and `convert` (proto), `metrics`, `config`, `server` (wiring,
lifecycle), `client` and `show` (for `mindmotor deploy`), `cli`.
"""
