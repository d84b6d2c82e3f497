"""XMC study: launch one trainer work unit, then let XMC search its ``lr`` and ``dropout`` (a study).

Run it against a running system (``./dev run`` prints the exports) with the unmodified XManager
client (``pip install xmanager==0.8.5.post1``):

    xmanager launch examples/study.py

The pod is simulated: its script (``sim.xmc.dev/script``) writes ``loss`` every second, computed from
the container's own arguments with ``arg('lr')`` and ``arg('dropout')``: lowest at ``lr = 0.01``,
``dropout = 0.2``. The unit launched here is the study's template; create the study over REST
(docs/architecture/studies.md):

    POST /v1/experiments/<xid>/studies
    {"templateWorkUnit": <wid>, "parameters": {"lr": {"logUniform": [1e-4, 1e-1]},
     "dropout": {"uniform": [0, 0.5]}}, "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
     "maxTrials": 8, "parallelTrials": 2, "sampler": "tpe", "pruner": {"median": {"warmupSteps": 3}}}

The script prints one JSON line, ``RESULT: {"xid": ..., "wid": ...}``.
"""
from __future__ import annotations

import json

from absl import app, flags
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables

_RUN_SECONDS = flags.DEFINE_integer("run_seconds", 12, "how long each unit trains")

#: What the simulated container reports each second (n: the step).
LOSS = "0.5+(log(arg('lr'))+4.6)**2/10+2*(arg('dropout')-0.2)**2+exp(-n/8)"


def main(_: list[str]) -> None:
    script = f"pull=1s;run={_RUN_SECONDS.value}s;exit=0;metrics=every:1s:loss={LOSS}"
    executor = xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB),
                                              annotations={"sim.xmc.dev/script": script})
    image = executables.GoogleContainerRegistryImage(name="trainer", image_path="gcr.io/xmc-demo/trainer:v1")
    experiment = xm_cloud.create_experiment(experiment_title="XMC study", tags=["study"])
    with experiment:
        experiment.add(xm.Job(executable=image, executor=executor, name="trainer",
                              args={"lr": "0.001", "dropout": "0.4"}),
                       settings=xm_cloud.WorkUnitSettings(notes="the study's template"))
    print("RESULT: " + json.dumps({"xid": experiment.id, "wid": 1}), flush=True)


if __name__ == "__main__":
    app.run(main)
