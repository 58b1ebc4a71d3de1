"""The provider's error root; each error also keeps its built-in kind, so ``except ValueError`` works."""

from __future__ import annotations


class DlqProviderError(Exception):
    """Base class of every error airflow-provider-dlq raises on purpose."""
