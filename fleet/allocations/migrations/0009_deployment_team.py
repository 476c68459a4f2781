# Every deployment belongs to a team: the ``default`` team is created and takes every
# deployment that exists (a data migration), then the column becomes required.

import django.db.models.deletion
from django.db import migrations, models


def assign_default_team(apps, schema_editor):
    team_model = apps.get_model("core", "Team")
    deployment_model = apps.get_model("allocations", "Deployment")
    team, _ = team_model.objects.get_or_create(slug="default", defaults={"name": "default"})
    deployment_model.objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ('allocations', '0008_replica_samples'),
        ('core', '0011_teams'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='deployments', to='core.team'),
        ),
        migrations.RunPython(assign_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='deployment',
            name='team',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='deployments', to='core.team'),
        ),
    ]
