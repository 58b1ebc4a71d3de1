"""Hooks of the provider: the ``pulsar`` connection, Pulsar clients and DLQ backlog reads."""
