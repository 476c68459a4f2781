"""Host.agent_protocol: the protocol a host's agent speaks (fleet.agents.versions)."""

from django.db import migrations, models


def agents_so_far_speak_protocol_1(apps, schema_editor):
    # Every agent released before this field existed (0.1.0) speaks protocol 1; it says so
    # again at its next hello.
    Host = apps.get_model("inventory", "Host")
    Host.objects.exclude(agent_version="").update(agent_protocol=1)


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0011_host_address"),
    ]

    operations = [
        migrations.AddField(
            model_name="host",
            name="agent_protocol",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(agents_so_far_speak_protocol_1, migrations.RunPython.noop),
    ]
