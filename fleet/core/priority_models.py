"""The priority classes' model (imported by :mod:`fleet.core.models`, where Django finds it)."""

from __future__ import annotations

from django.db import models


class PriorityClass(models.Model):
    """One of the ordered priorities admins define (``critical``, ``production``, ``batch``): a
    higher ``value`` is served first in the queue and yields last within its team. It never lets
    a team take another team's deserved share. Deployments name it (``Deployment.priority``)."""

    name = models.SlugField(max_length=32, unique=True)
    value = models.IntegerField(unique=True)
    description = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-value"]

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"
