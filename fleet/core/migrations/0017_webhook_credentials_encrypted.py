"""Webhook URLs and signing secrets encrypted at rest, as team secrets are (Fernet under
FLEET_SECRETS_KEYS): existing rows are encrypted, and their ``url`` keeps only what may be shown
(``scheme://host[:port]/…``). Reversible while a key that encrypted them is configured."""

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import migrations, models

from fleet.core.redaction import url_shown


def _cipher():
    return MultiFernet([Fernet(key) for key in settings.FLEET_SECRETS_KEYS])


def encrypt_credentials(apps, schema_editor):
    AlertWebhook = apps.get_model("core", "AlertWebhook")
    cipher = _cipher()
    for webhook in AlertWebhook.objects.order_by("pk"):
        AlertWebhook.objects.filter(pk=webhook.pk).update(
            url=url_shown(webhook.url),
            url_ciphertext=cipher.encrypt(webhook.url.encode("utf-8")).decode("ascii"),
            secret_ciphertext=cipher.encrypt(webhook.secret.encode("utf-8")).decode("ascii"),
        )


def decrypt_credentials(apps, schema_editor):
    AlertWebhook = apps.get_model("core", "AlertWebhook")
    cipher = _cipher()
    for webhook in AlertWebhook.objects.order_by("pk"):
        try:
            url = cipher.decrypt(webhook.url_ciphertext.encode("ascii")).decode("utf-8")
            secret = cipher.decrypt(webhook.secret_ciphertext.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise RuntimeError(
                f"webhook #{webhook.pk}: no key in FLEET_SECRETS_KEYS opens its credentials"
            ) from exc
        AlertWebhook.objects.filter(pk=webhook.pk).update(url=url, secret=secret)


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0016_operation_requested_by_name"),
    ]

    operations = [
        migrations.AddField(
            model_name="alertwebhook",
            name="url_ciphertext",
            field=models.TextField(default=""),
        ),
        migrations.AddField(
            model_name="alertwebhook",
            name="secret_ciphertext",
            field=models.TextField(default=""),
        ),
        # A default, so that undoing the removal below can add the column back to existing rows.
        migrations.AlterField(
            model_name="alertwebhook",
            name="secret",
            field=models.CharField(default="", max_length=256),
        ),
        migrations.RunPython(encrypt_credentials, decrypt_credentials),
        migrations.RemoveField(
            model_name="alertwebhook",
            name="secret",
        ),
    ]
