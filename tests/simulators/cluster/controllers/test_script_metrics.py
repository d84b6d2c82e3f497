"""The script key ``metrics=every:<d>:<name>=<expr>,...``: parsing, safe expressions, the points due."""
from __future__ import annotations

import math

import pytest

from simulators.cluster.controllers.script import ScriptError, container_args, metric_points, parse_script


def test_it_parses_metrics_and_computes_the_points_due() -> None:
    script = parse_script("pull=1s;run=30s;metrics=every:2s:loss=exp(-t/30),acc=max(0, 1-exp(-t/20)),n2=n*n")
    assert script.metrics_every == 2.0
    assert [name for name, _ in script.metrics] == ["loss", "acc", "n2"]
    points = metric_points(script, 100.0, 0, 105.0)
    assert [(n, t) for n, t, _ in points] == [(1, 102.0), (2, 104.0)]
    assert points[1][2] == {"loss": math.exp(-4 / 30), "acc": 1 - math.exp(-4 / 20), "n2": 4.0}
    assert [n for n, _, _ in metric_points(script, 100.0, 1, 106.0)] == [2, 3]  # after the ones sent


def test_it_leaves_out_values_undefined_at_a_point() -> None:
    script = parse_script("metrics=every:1s:inv=1/(n-1),ok=1")
    (first, second) = metric_points(script, 0.0, 0, 2.0)
    assert first[2] == {"ok": 1.0} and second[2] == {"inv": 1.0, "ok": 1.0}


@pytest.mark.parametrize("text", [
    "metrics=every:1s:x=__import__('os')", "metrics=every:1s:x=t.real", "metrics=every:1s:x=", "metrics=1s:x=t",
    "metrics=every:1s:", "metrics=every:1s:bad name=t", "metrics=every:1s:x=exp(t, k=1)", "metrics=every:1s:x=[t]",
])
def test_it_refuses_anything_but_arithmetic(text: str) -> None:
    with pytest.raises(ScriptError):
        parse_script(text)


def test_it_lets_an_expression_read_the_containers_arguments() -> None:
    args = container_args(["--lr=0.01", "--batch_size=32", "positional", "--name=resnet", "-v"])
    assert args == {"lr": "0.01", "batch_size": "32", "name": "resnet"}
    script = parse_script("metrics=every:1s:loss=(log(arg('lr'))+4.6)**2/10+exp(-t/20),b=arg('batch_size')*n", args)
    (point,) = metric_points(script, 0.0, 0, 1.0)
    assert point[2] == {"loss": pytest.approx((math.log(0.01) + 4.6) ** 2 / 10 + math.exp(-1 / 20)), "b": 32.0}


@pytest.mark.parametrize(("expression", "words"), [
    ("arg('lr')", "no --lr=<number> argument"),  # missing
    ("arg('name')", "'resnet' is not a number"),
    ("arg('inf')", "not a finite number"),
    ("arg(lr)", "write arg('<name>')"),
    ("arg('lr', 1)", "write arg('<name>')"),
])
def test_it_makes_a_missing_or_non_numeric_argument_a_script_error(expression: str, words: str) -> None:
    with pytest.raises(ScriptError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_script(f"metrics=every:1s:x={expression}", {"name": "resnet", "inf": "inf"})
