"""Team secrets at rest: Fernet under FLEET_SECRETS_KEYS (the first key encrypts, every key
decrypts, so keys rotate), a key generated once per data directory in the embedded mode and
required in production, bounded values, and env digests for the audit trail."""

from __future__ import annotations

import io
import stat

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from fleet.core.errors import ServiceError
from fleet.core.models import Team, TeamSecret
from fleet.core.secrets import (
    MAX_VALUE_CHARS,
    secret_decrypt,
    secret_encrypt,
    secret_value_checked,
    secrets_reencrypt,
    team_secret_values,
    value_digest,
    workload_digested,
)
from fleet.settings.secret_key import embedded_secrets_key, fernet_keys, new_fernet_key
from tests.core.test_security_settings import PRODUCTION, run_django

OLD, NEW = new_fernet_key(), new_fernet_key()


def test_a_value_is_encrypted_and_decrypted_back(settings):
    settings.FLEET_SECRETS_KEYS = [OLD]

    token = secret_encrypt("hf_abc_123")

    assert "hf_abc_123" not in token
    assert secret_decrypt(token) == "hf_abc_123"
    assert secret_encrypt("hf_abc_123") != token  # a fresh IV each time


def test_a_new_key_first_still_reads_the_old_ones_and_rotation_moves_them_over(settings, db):
    settings.FLEET_SECRETS_KEYS = [OLD]
    team = Team.objects.create(name="alpha", slug="alpha")
    TeamSecret.objects.create(team=team, name="hf", ciphertext=secret_encrypt("v-one"))

    settings.FLEET_SECRETS_KEYS = [NEW, OLD]
    assert team_secret_values(team.pk, ["hf"]) == {"hf": "v-one"}
    assert secrets_reencrypt() == (1, 0)

    settings.FLEET_SECRETS_KEYS = [NEW]  # the old key dropped: still readable
    assert team_secret_values(team.pk, ["hf"]) == {"hf": "v-one"}


def test_without_the_key_that_encrypted_it_a_secret_is_unreadable_not_an_error(settings, db):
    settings.FLEET_SECRETS_KEYS = [OLD]
    team = Team.objects.create(name="alpha", slug="alpha")
    TeamSecret.objects.create(team=team, name="hf", ciphertext=secret_encrypt("v-one"))

    settings.FLEET_SECRETS_KEYS = [NEW]

    assert secret_decrypt(TeamSecret.objects.get().ciphertext) is None
    assert team_secret_values(team.pk, ["hf"]) == {}
    assert secrets_reencrypt() == (0, 1)


def test_the_embedded_key_is_made_once_per_data_directory_and_private(tmp_path):
    first = embedded_secrets_key(tmp_path)

    assert first == embedded_secrets_key(tmp_path)
    assert len(first) == 1
    mode = stat.S_IMODE((tmp_path / "secrets_key").stat().st_mode)
    assert mode == 0o600
    assert embedded_secrets_key(tmp_path / "other") != first


def test_a_malformed_key_stops_the_start_without_showing_it():
    with pytest.raises(ImproperlyConfigured) as refused:
        fernet_keys(f"{NEW},not-a-key-at-all")

    assert "Key 2 of FLEET_SECRETS_KEY" in str(refused.value)
    assert "not-a-key-at-all" not in str(refused.value)
    assert fernet_keys(f" {NEW} , {OLD} ") == [NEW, OLD]


def test_production_refuses_to_start_without_a_secrets_key():
    without = {k: v for k, v in PRODUCTION.items() if k != "FLEET_SECRETS_KEY"}

    done = run_django(["manage.py", "check"], **without)

    assert done.returncode != 0
    assert "FLEET_SECRETS_KEY is required when FLEET_MODE=production" in done.stderr


def test_the_command_prints_a_usable_key():
    out = io.StringIO()

    call_command("secrets_key", stdout=out)

    assert fernet_keys(out.getvalue().strip()) == [out.getvalue().strip()]


@pytest.mark.parametrize(
    "value",
    ["", "a\x00b", "x" * (MAX_VALUE_CHARS + 1), 42, None, "\ud800-lone-surrogate"],
)
def test_a_value_is_a_bounded_string_and_the_refusal_never_repeats_it(value):
    with pytest.raises(ServiceError) as refused:
        secret_value_checked(value)

    assert refused.value.code == "secret.value_invalid"
    if isinstance(value, str) and value:
        assert value not in refused.value.message


def test_the_longest_value_allowed_is_accepted():
    assert secret_value_checked("x" * MAX_VALUE_CHARS) == "x" * MAX_VALUE_CHARS


def test_an_audited_workload_keeps_env_names_and_references_but_digests_values():
    workload = {"runtime": "process", "env": {"DB": "s3cr3t", "HF": {"secret": "hf-token"}}}

    digested = workload_digested(workload)

    assert digested["env"] == {"DB": value_digest("s3cr3t"), "HF": {"secret": "hf-token"}}
    assert digested["env"]["DB"].startswith("sha256:") and len(digested["env"]["DB"]) == 19
    assert "s3cr3t" not in str(digested)
    assert workload["env"]["DB"] == "s3cr3t"  # the given workload is left alone
