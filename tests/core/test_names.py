"""Resource names: one shape each, read as a whole, ids in ASCII digits and in range."""
from __future__ import annotations

import pytest

from core import names
from core.errors import InvalidArgument
from core.limits import MAX_ID


@pytest.mark.parametrize("name, parsed", [
    ("experiments/7", (7, None)),
    ("experiments/7/workUnits/3", (7, 3)),
    (f"experiments/{MAX_ID}", (MAX_ID, None)),
])
def test_it_reads_a_parent(name: str, parsed: tuple[int, int | None]) -> None:
    assert names.parse_parent(name) == parsed


@pytest.mark.parametrize("name", [
    "", "experiments/", "experiments/٣", "experiments/7\n", "experiments/07x", "experiment/7",
    f"experiments/{MAX_ID + 1}", "experiments/7/workUnits/", "/experiments/7",
])
def test_it_refuses_a_name_of_another_shape_naming_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        names.parse_parent(name, "parent")
    assert refused.value.field == "parent"


def test_it_writes_the_names_it_reads() -> None:
    assert names.parse_work_unit(names.work_unit_name(12, 4)) == (12, 4)
    assert names.parse_experiment(names.experiment_name(12)) == 12


def test_it_takes_the_same_ids_in_the_path_converter() -> None:
    converter = names.IdConverter()
    assert converter.to_python("42") == 42 and converter.to_url(42) == "42"
    with pytest.raises(ValueError):
        converter.to_python(str(MAX_ID + 1))


def test_it_reads_an_operation_name_with_or_without_its_work_unit() -> None:
    assert names.parse_operation("experiments/3/workUnits/4/operations/5") == (3, 4, 5)
    assert names.parse_operation("experiments/3/operations/5") == (3, None, 5)
    with pytest.raises(InvalidArgument, match="operation_name"):
        names.parse_operation("experiments/3/operations/5\n", "operation_name")
