"""Container logs of executions: read live through `pods/log`, archived when the pods go.

`k8s_bridge.logs.pods` (the cluster side), `k8s_bridge.logs.archive` (the
archive and its thread), `k8s_bridge.logs.service` (what the REST endpoint
`k8s_bridge.logs.views` serves). See docs/architecture/logs.md.
"""
