"""Readers and analyses of real request traces and telemetry exports (study A's figure A1 and
the trace-driven parts of both studies): each reader turns an export in its published format
into a tidy DataFrame plus a report of what it skipped, so that an analysis never silently
works on half a file, and a synthetic stand-in with the same format exists wherever the
original data is private.
"""
