"""Schemes for Airflow's common-messaging ``MessageQueueTrigger`` (provider info key ``queues``)."""

from __future__ import annotations
