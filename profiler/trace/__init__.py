"""The Trace model, its ingestion and its store."""
from profiler.trace.ingest import load_trace
from profiler.trace.model import Trace, TraceError
from profiler.trace.schema import COLUMNS, KINDS, SCHEMA_VERSION

__all__ = ["Trace", "TraceError", "COLUMNS", "KINDS", "SCHEMA_VERSION", "load_trace"]
