"""Fusion advisor: match, rewrite, numerics gate, measure."""
