"""The JobSet contract, the manifest builder and its validation: pure data (protobuf -> dict).

Imports no Kubernetes SDK (the API processes validate requests through it) and
no app: ``workunits`` (validation), ``lifecycle`` (the annotation) and
``k8s_bridge`` (labels, manifests) all build on it.
"""
