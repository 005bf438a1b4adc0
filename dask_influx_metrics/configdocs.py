"""The documents derived from the settings table (:data:`.configtable.SETTINGS`): the shipped
``influx-metrics.yaml`` and the docs/settings.md table, kept equal to it by ``tests/test_config.py``."""

from __future__ import annotations

import yaml

from .configtable import SETTINGS, Setting


def _yaml_value(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()


def _doc(setting: Setting) -> str:
    return f"{setting.doc} ({setting.unit})" if setting.unit else setting.doc


_YAML_HEADER = """\
# Defaults for dask-influx-metrics. Every key can be set with dask.config,
# a YAML file in ~/.config/dask/, or an environment variable such as
# DASK_INFLUX_METRICS__SINK=udp. Monitor(...) and attach(...) override per call.
# Generated from dask_influx_metrics/configtable.py (SETTINGS) by configdocs.defaults_yaml(); edit it there.
"""


def defaults_yaml() -> str:
    """The text of ``influx-metrics.yaml``: every default with its doc as a comment."""
    lines, section = [_YAML_HEADER + "influx-metrics:"], ""
    for s in SETTINGS:
        parent, _, leaf = s.key.rpartition(".")
        if parent != section:
            lines.append(f"  {parent}:")
            section = parent
        indent = "    " if parent else "  "
        lines.append(f"{indent}{leaf}: {_yaml_value(s.default)}".ljust(31) + f"# {_doc(s)}")
    return "\n".join(lines) + "\n"


def settings_table_markdown() -> str:
    """The docs/settings.md table: key (keywords), default, unit, meaning."""
    rows = ["| key (keywords) | default | unit | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        keywords = ", ".join(f"`{k}`" for k in s.kwargs)
        rows.append(f"| `{s.key}` ({keywords}) | `{_yaml_value(s.default)}` | {s.unit} | {s.doc} |")
    return "\n".join(rows) + "\n"
