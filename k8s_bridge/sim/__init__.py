"""A local Kubernetes API server with JobSet, Kueue and pod behaviour (the cluster simulator).

Layout: `k8s_bridge.sim.store` (all API semantics, used in-process by the
controllers), `k8s_bridge.sim.resources` (served types),
`k8s_bridge.sim.apiserver` (the thin HTTP layer), `k8s_bridge.sim.server`
(`run_simulator`, used by `manage.py simcluster` and the tests), and the
controllers in `k8s_bridge.sim.controllers` with the clock in
`k8s_bridge.sim.clock`.  See docs/architecture/simulator_apiserver.md.
"""
