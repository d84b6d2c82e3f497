"""A local Kubernetes API server with JobSet, Kueue and pod behaviour (the cluster simulator).

Layout: `simulators.cluster.store` (all API semantics, used in-process by the
controllers), `simulators.cluster.resources` (served types),
`simulators.cluster.apiserver` (the thin HTTP layer), `simulators.cluster.server`
(`run_simulator`, used by `python -m simulators.cluster` and the tests), and the
controllers in `simulators.cluster.controllers` with the clock in
`simulators.cluster.clock`.  See docs/architecture/simulator_apiserver.md.
"""
