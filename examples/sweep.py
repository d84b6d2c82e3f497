"""XMC sweep: ``lr`` x ``batch_size``, each unit reporting a loss that depends on its arguments.

Run it against a running system (``./dev run`` prints the exports) with the unmodified XManager
client (``pip install xmanager==0.8.5.post1``):

    xmanager launch examples/sweep.py

The pods are simulated: their script (``sim.xmc.dev/script``) writes ``loss`` and ``accuracy``
every second through the metrics write path, computed from the container's own arguments with
``arg('lr')`` and ``arg('batch_size')``: the loss is lowest at ``lr = 0.01`` and grows with the batch
size. Then ``xmc compare <xid>`` ranks the units, ``GET /v1/experiments/<xid>:importance?metric=loss``
says ``lr`` matters most, and the experiment page shows the table (docs/architecture/sweeps.md).

The script prints one JSON line, ``RESULT: {"xid": ..., "wids": {"<lr>/<batch_size>": wid, ...}}``.
"""
from __future__ import annotations

import itertools
import json

from absl import app, flags
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables

_RUN_SECONDS = flags.DEFINE_integer("run_seconds", 12, "how long each unit trains")
_LRS = flags.DEFINE_list("lrs", ["0.001", "0.003", "0.01", "0.1"], "the learning rates")
_BATCHES = flags.DEFINE_list("batch_sizes", ["16", "256"], "the batch sizes")

#: What every simulated container reports each second (t: seconds since it started).
LOSS = "(log(arg('lr'))+4.6)**2/10+arg('batch_size')/1000+exp(-t/20)"
ACCURACY = "1/(1+(log(arg('lr'))+4.6)**2/10+arg('batch_size')/1000)"


def main(_: list[str]) -> None:
    script = f"pull=1s;run={_RUN_SECONDS.value}s;exit=0;metrics=every:1s:loss={LOSS},accuracy={ACCURACY}"
    executor = xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB),
                                              annotations={"sim.xmc.dev/script": script})
    image = executables.GoogleContainerRegistryImage(name="trainer", image_path="gcr.io/xmc-demo/trainer:v1")
    experiment = xm_cloud.create_experiment(experiment_title="XMC sweep", tags=["sweep"])
    wids: dict[str, int] = {}
    with experiment:
        for wid, (lr, batch) in enumerate(itertools.product(_LRS.value, _BATCHES.value), start=1):
            experiment.add(xm.Job(executable=image, executor=executor, name="trainer",
                                  args={"lr": lr, "batch_size": batch, "epochs": "3"}),
                           settings=xm_cloud.WorkUnitSettings(notes=f"lr {lr}, batch size {batch}"))
            wids[f"{lr}/{batch}"] = wid  # the client numbers work units in the order they are added
    print("RESULT: " + json.dumps({"xid": experiment.id, "wids": wids}), flush=True)


if __name__ == "__main__":
    app.run(main)
