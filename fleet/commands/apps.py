from __future__ import annotations

from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "fleet.commands"
    label = "commands"
    verbose_name = "Fleet commands"
