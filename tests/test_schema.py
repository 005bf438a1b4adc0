"""The data contract tables of docs/data-contract.md are schema.py, rendered: keep them equal."""

import pathlib

import pytest

from dask_influx_metrics import schema

README = (pathlib.Path(__file__).parent.parent / "docs" / "data-contract.md").read_text()


@pytest.mark.parametrize("field", schema._FIELDS, ids=lambda f: f"{f.measurement}.{f.name}")
def test_every_field_is_documented_with_type_and_unit(field):
    row = f"| `{field.measurement}` | `{field.name}` | {field.type.__name__} | {field.unit or '-'} |"
    assert row in README


@pytest.mark.parametrize("name", schema.TRACKING)
def test_every_tracking_name_is_documented(name):
    fields = ", ".join(f"`{m}.{f}`" for m, f in schema.TRACKING[name])
    assert f"| `{name}` | {fields} |" in README


def test_tracking_names_point_at_declared_fields():
    for pairs in schema.TRACKING.values():
        assert all(pair in schema.FIELDS for pair in pairs)


def test_unknown_tracking_names_are_listed_in_the_error():
    with pytest.raises(ValueError, match="gpu-fun.*known"):
        schema.fields_for(["gpu-fun"])


@pytest.mark.parametrize("tag", schema.TAGS)
def test_every_tag_is_documented(tag):
    assert f"| `{tag}` | {schema.TAGS[tag]} |" in README


def test_each_table_header_appears_once():
    """The tracking-names table had its header twice (issue 24)."""
    for header in ("| name | fields |", "| tag | meaning |", "| measurement | field | type | unit | meaning |"):
        assert README.count(header) == 1, header
