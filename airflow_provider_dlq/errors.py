"""The provider's error root: every error it raises on purpose is a :class:`DlqProviderError`.

Each also keeps its built-in kind (``ValueError``, ``RuntimeError``), so ``except ValueError`` still works."""

from __future__ import annotations


class DlqProviderError(Exception):
    """Base class of every error airflow-provider-dlq raises on purpose."""
