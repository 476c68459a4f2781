from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    name = "fleet.autoscaling"
    label = "autoscaling"
    verbose_name = "Autoscaling"
    default_auto_field = "django.db.models.BigAutoField"
