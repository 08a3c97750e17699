"""The InferenceService operator: `serving.mindmotor.io/v1` objects reconciled into the Deployer's
Kubernetes backend (a Deployment per version and role, a Service per version) and the controller's
traffic weights, with status conditions and a finalizer; built on kopf (the `operator` extra).

    resource.py    the custom resource's spec, as the operator reads it, and its DeploymentSpec
    reconcile.py   one pass over one InferenceService; deletion
    status.py      conditions and the status merge patch
    traffic.py     the weights to the controller (the Deployer's ControllerLink), or nowhere
    connection.py  where the Kubernetes API is, for kopf and the backend alike
    handlers.py    the kopf handlers (create, update, resume, a resync timer, delete)
    cli.py         `mindmotor operator`

The CRD, RBAC, the operator's Deployment and an example are in deploy/kubernetes/operator/.
"""
