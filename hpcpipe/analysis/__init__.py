"""Scaling studies: read result files, fit what was measured, set it beside the bounds.

Each study module exposes ``study(records) -> StudyResult`` (verdict rows,
tables, figures); ``report`` runs the studies whose data are present and
writes a Markdown report with PNG figures.
"""
