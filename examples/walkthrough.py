"""XMC walkthrough: one experiment, four work units, everything the loop does.

Run it against a running system (``./dev run`` prints the exports) with the
unmodified XManager client (``pip install xmanager==0.8.5.post1``):

    xmanager launch examples/walkthrough.py

The pods are simulated: the pod template annotation ``sim.xmc.dev/script``
tells the bundled cluster simulator what each container does (a real cluster
ignores it and runs the image). The four work units:

1. ``succeeds`` — pulls, runs 20 s, exits 0: COMPLETED.
2. ``fails`` — runs 5 s and exits 1, retried once (a retry limit of 0 is
   the proto default, which the server reads as "use the default", five per
   replica): FAILED, with the reason in its status message.
3. ``preempted`` — LOW priority, fills the small ``demo-queue``; it is RUNNING
   when ...
4. ``profiled`` — HIGH priority in the same queue, with a managed_xprof
   artifact, arrives (after ``--preempt_after`` seconds) and preempts it:
   ``preempted`` goes back to SCHEDULING with the eviction reason, and runs
   again once ``profiled`` has COMPLETED. ``profiled``'s artifact gets a
   MachineLearningRun link when the artifact lifecycle is on.

The script prints one JSON line, ``RESULT: {"xid": ..., "wids": {...}}``.
"""
from __future__ import annotations

import json
import time

from absl import app, flags
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables

_PREEMPT_AFTER = flags.DEFINE_integer(
    "preempt_after", 25, "seconds to wait before adding the high-priority work unit")
_RUN_SECONDS = flags.DEFINE_integer("run_seconds", 20, "how long the succeeding jobs run")
_QUEUE = flags.DEFINE_string("demo_queue", "demo-queue", "the small queue where preemption happens")

SCRIPT = "sim.xmc.dev/script"


def _job(name: str, script: str, *, cpu: int = 1, retries: int | None = None) -> xm.Job:
    executor = xm_cloud.KubernetesJobExecutor(
        requirements=xm.JobRequirements(cpu=cpu, memory=xm.GiB),
        annotations={SCRIPT: script},
        **({"replica_retry_limit": retries} if retries is not None else {}),
    )
    image = executables.GoogleContainerRegistryImage(name=name, image_path=f"gcr.io/xmc-demo/{name}:v1")
    return xm.Job(executable=image, executor=executor, name=name, args={"steps": "1000"})


def main(_: list[str]) -> None:
    run_s = _RUN_SECONDS.value
    demo = xm_cloud.SchedulingConstraints(queue_name=_QUEUE.value)
    experiment = xm_cloud.create_experiment(experiment_title="XMC walkthrough", tags=["walkthrough"])
    # The client numbers work units 1, 2, 3, 4 in the order they are added.
    wids = {"succeeds": 1, "fails": 2, "preempted": 3, "profiled": 4}
    with experiment:
        experiment.add(_job("succeeds", f"pull=2s;run={run_s}s;exit=0"),
                       settings=xm_cloud.WorkUnitSettings(notes="runs to COMPLETED"))
        experiment.add(_job("fails", "pull=1s;run=5s;exit=1", retries=1),
                       settings=xm_cloud.WorkUnitSettings(notes="exits 1 twice: FAILED"))
        experiment.add(_job("preempted", f"pull=1s;run={3 * run_s}s;exit=0", cpu=4),
                       settings=xm_cloud.WorkUnitSettings(priority=xm_cloud.Priority.LOW,
                                                          scheduling_constraints=demo,
                                                          notes="preempted, then resumes"))
        # Let the low-priority job start before its preemptor arrives.
        time.sleep(_PREEMPT_AFTER.value)
        experiment.add(_job("profiled", f"pull=1s;run={run_s}s;exit=0", cpu=4),
                       settings=xm_cloud.WorkUnitSettings(priority=xm_cloud.Priority.HIGH,
                                                          scheduling_constraints=demo,
                                                          notes="high priority, profiled"))
    profiled = xm_cloud.get_work_unit(experiment.id, wids["profiled"])
    profiled.create_artifact(managed_xprof={"display_name": "walkthrough profile",
                                            "run_group": "gs://xmc-demo/profiles/walkthrough"})
    print("RESULT: " + json.dumps({"xid": experiment.id, "wids": wids}), flush=True)


if __name__ == "__main__":
    app.run(main)
