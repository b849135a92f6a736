"""Drift audit: re-render each recorded call's conversation fresh from text, as a system that
re-tokenizes would, and compare with the prompt IDs the model actually consumed."""

from polarproxy.audit.compare import TokenDiff, compare
from polarproxy.audit.episodes import (
    SKIP_REASONS,
    AuditReport,
    CallAudit,
    EpisodeAudit,
    Summary,
    audit_store,
)

__all__ = [
    "SKIP_REASONS",
    "AuditReport",
    "CallAudit",
    "EpisodeAudit",
    "Summary",
    "TokenDiff",
    "audit_store",
    "compare",
]
