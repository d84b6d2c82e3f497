"""Resource types served by the cluster simulator.

`RESOURCE_TYPES` is the single table of every store-backed resource the
simulator's API server serves (namespaces, pods, events, batch Jobs, JobSets,
the Kueue kinds and Leases).  The store (`simulators.cluster.store`) uses it for
per-type semantics (scope, status subresource, CRD or built-in, supported field
selectors), the HTTP layer (`simulators.cluster.apiserver`) for URL routing and
discovery, and the simulated controllers (`simulators.cluster.controllers`) to name
what they read and write: ``store.get(by_plural("pods"), ns, name)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    """One served resource (group/version/plural) and how the server treats it.

    The first seven fields are the interface shared with the controllers; the
    rest tune server behaviour and have defaults.
    """

    group: str  # "" for the core group
    version: str  # "v1", "v1alpha2", "v1beta1"
    plural: str  # "jobsets"
    kind: str  # "JobSet"
    namespaced: bool = True
    subresources: tuple[str, ...] = ("status",)  # pods also "log"
    short_names: tuple[str, ...] = ()
    # --- server behaviour ---------------------------------------------------
    crd: bool = False  # CustomResourceDefinition semantics (no SMP, PUT needs RV)
    categories: tuple[str, ...] = ()
    # Field selectors supported besides metadata.name / metadata.namespace.
    field_selectors: tuple[str, ...] = ()
    # DELETE answers with the deleted object instead of a Status (pods, namespaces).
    return_deleted_object: bool = False
    # metadata.generation is maintained for this type.
    has_generation: bool = True
    # Default propagation policy of DELETE when the client gives none.
    default_propagation: str = "Background"
    # Versions served besides `version` (the storage version), converted by
    # simulators.cluster.versions; the storage version is listed first in discovery.
    other_versions: tuple[str, ...] = ()

    @property
    def served_versions(self) -> tuple[str, ...]:
        return (self.version, *self.other_versions)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status_subresource(self) -> bool:
        return "status" in self.subresources

    @property
    def strategic_merge(self) -> bool:
        """Built-in types accept strategic merge patch; custom resources answer 415."""
        return not self.crd

    @property
    def qualified_resource(self) -> str:
        """`jobsets.jobset.x-k8s.io` or `pods`, as used in NotFound/Conflict messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`JobSet.jobset.x-k8s.io` or `Pod`, as used in Invalid/precondition messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

RESOURCE_TYPES: dict[str, ResourceType] = {
    rt.plural: rt
    for rt in (
        ResourceType(
            "", "v1", "namespaces", "Namespace", namespaced=False,
            subresources=("status", "finalize"), short_names=("ns",),
            field_selectors=("status.phase",), return_deleted_object=True,
            has_generation=False,
        ),
        ResourceType(
            "", "v1", "pods", "Pod", subresources=("status", "log"),
            short_names=("po",), categories=("all",), field_selectors=_POD_FIELDS,
            return_deleted_object=True,
        ),
        ResourceType(
            "", "v1", "events", "Event", subresources=(), short_names=("ev",),
            field_selectors=_EVENT_FIELDS, has_generation=False,
        ),
        ResourceType(
            "batch", "v1", "jobs", "Job", categories=("all",),
            field_selectors=("status.successful",),
            # batch/v1 Jobs keep the legacy default: a DELETE without a policy
            # orphans the pods (kubectl always sends Background explicitly).
            default_propagation="Orphan",
        ),
        ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", crd=True),
        # Kueue: v1beta2 is the storage version (Kueue >= 0.16), v1beta1 is still
        # served (deprecated) with conversion (simulators.cluster.versions).  Short
        # names as in kueue config/components/crd/bases (kwl, kueueworkload(s)),
        # plus the older `wl`.
        ResourceType(
            "kueue.x-k8s.io", "v1beta2", "workloads", "Workload",
            short_names=("kwl", "kueueworkload", "kueueworkloads", "wl"),
            crd=True, categories=("kueue",), other_versions=("v1beta1",),
        ),
        ResourceType(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False,
            short_names=("cq",), crd=True, categories=("kueue",), other_versions=("v1beta1",),
        ),
        ResourceType(
            "kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue",
            short_names=("queue", "queues", "lq"), crd=True, categories=("kueue",), other_versions=("v1beta1",),
        ),
        ResourceType(
            "kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False,
            subresources=(), short_names=("flavor", "flavors", "rf"), crd=True,
            categories=("kueue",), other_versions=("v1beta1",),
        ),
        ResourceType(
            "kueue.x-k8s.io", "v1beta2", "admissionchecks", "AdmissionCheck", namespaced=False,
            crd=True, categories=("kueue",), other_versions=("v1beta1",),
        ),
        ResourceType(
            "coordination.k8s.io", "v1", "leases", "Lease", subresources=(),
            has_generation=False,
        ),
    )
}


def by_plural(plural: str) -> ResourceType:
    """The resource type for `plural` (KeyError if the simulator does not serve it)."""
    return RESOURCE_TYPES[plural]


def by_group_version_plural(group: str, version: str, plural: str) -> ResourceType | None:
    """The (storage-version) resource type served at group/version/plural, or None."""
    rt = RESOURCE_TYPES.get(plural)
    if rt is None or rt.group != group or version not in rt.served_versions:
        return None
    return rt


def group_versions() -> dict[str, list[ResourceType]]:
    """Resource types grouped by served apiVersion (storage versions first), in table order.

    The lists hold the storage-version `ResourceType`; a caller describing
    another served version uses the key's version.
    """
    out: dict[str, list[ResourceType]] = {}
    for rt in RESOURCE_TYPES.values():
        out.setdefault(rt.api_version, []).append(rt)
    for rt in RESOURCE_TYPES.values():
        for v in rt.other_versions:
            out.setdefault(f"{rt.group}/{v}" if rt.group else v, []).append(rt)
    return out
