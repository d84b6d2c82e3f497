"""Stand-ins for the outside systems XMC talks to, for local runs, tests and benchmarks.

* ``simulators.cluster``: a Kubernetes API server with JobSet, Kueue, Job and
  kubelet controllers (``python -m simulators.cluster``);
* ``simulators.mlrun``: the MachineLearningRun API (``python -m simulators.mlrun``).

Standard library and PyYAML only: no Django and nothing of XMC's, and nothing in
production imports them (two ``.importlinter`` contracts hold both directions).
The production image leaves this package out (``.dockerignore``).
"""
