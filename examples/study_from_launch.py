"""XMC study from the launch script (xmc_study): a TPE search over ``lr``, ``batch_size`` and ``dropout`` with median pruning, run server-side.

Run it against a running system (``./dev run`` prints the exports) with the unmodified XManager
client and the XMC client package beside it (``pip install xmanager==0.8.5.post1 ./clients/python``):

    xmanager launch examples/study_from_launch.py

The script launches ONE work unit, the study's template, as any XManager launch script does; then
``xmc_study.create`` asks XMC to search: XMC clones that unit per trial with the arguments its
sampler picks (Optuna's TPE), keeps ``--parallel`` trials running, stops the trials whose loss is
above the median of the others at the same step, and records the best. The script may exit (and the
laptop close): the study lives in XMC's database. Follow it with ``xmc study show <xid>/<sid>`` or on
its page (the URL printed), stop it with ``xmc study stop <xid>/<sid>``.

The pods are simulated: their script (``sim.xmc.dev/script``) writes ``loss`` every second from the
container's own arguments with ``arg('lr')``, ``arg('batch_size')`` and ``arg('dropout')``: the loss
is lowest at ``lr = 0.01``, a small batch and ``dropout = 0.2``, and falls with time as training does.

The script prints one JSON line, ``RESULT: {"xid": ..., "sid": ..., "url": ...}``.
"""
from __future__ import annotations

import json

from absl import app, flags
from xmanager import xm, xm_cloud
from xmanager.xm_local import executables

import xmc_study

_RUN_SECONDS = flags.DEFINE_integer("run_seconds", 20, "how long each trial trains")
_TRIALS = flags.DEFINE_integer("max_trials", 24, "trials in all")
_PARALLEL = flags.DEFINE_integer("parallel", 4, "trials running at once")

#: What every simulated container reports each second (t: seconds since it started).
LOSS = "(log(arg('lr'))+4.6)**2/10+arg('batch_size')/1000+(arg('dropout')-0.2)**2+exp(-t/5)"


def main(_: list[str]) -> None:
    script = f"pull=1s;run={_RUN_SECONDS.value}s;exit=0;metrics=every:1s:loss={LOSS}"
    executor = xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB),
                                              annotations={"sim.xmc.dev/script": script})
    image = executables.GoogleContainerRegistryImage(name="trainer", image_path="gcr.io/xmc-demo/trainer:v1")
    experiment = xm_cloud.create_experiment(experiment_title="XMC study", tags=["study"])
    with experiment:  # the template: the study's trials are copies of it with other arguments
        # xm_cloud's add takes its settings always (without them: "Only WorkUnitSettings values for
        # 'role' are supported, got NoneType").
        experiment.add(xm.Job(executable=image, executor=executor, name="trainer",
                              args={"lr": "0.01", "batch_size": "64", "dropout": "0.1", "epochs": "3"}),
                       settings=xm_cloud.WorkUnitSettings(notes="the study's template"))
    study = xmc_study.create(
        experiment, 1,  # the client numbers work units in the order they are added
        parameters={"lr": "log:1e-4:1e-1", "batch_size": "choice:32,64,128", "dropout": "uniform:0:0.5"},
        objective="loss:last:min", max_trials=_TRIALS.value, parallel_trials=_PARALLEL.value,
        sampler="tpe", pruner="median:5")
    print("RESULT: " + json.dumps({"xid": study.xid, "sid": study.sid, "url": study.url}), flush=True)


if __name__ == "__main__":
    app.run(main)
