"""FusionLens profiler: trace model and ingestion, capture, analyses, presentation, CLI."""
