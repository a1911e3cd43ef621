"""``selfsup report RUN_DIR``: one self-contained HTML page about a run (see :func:`build_report`)."""

from selfsup.report.build import SECTIONS, build_report

__all__ = ["SECTIONS", "build_report"]
