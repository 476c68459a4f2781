"""Row factories for tests (factory-boy)."""

from __future__ import annotations

from typing import Any

import factory

from fleet.inventory.models import Gpu, GpuHealth, Host, HostStatus
from fleet.mig import product_by_key


class HostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Host

    name = factory.Sequence(lambda n: f"host-{n:03d}")
    status = HostStatus.READY


class GpuFactory(factory.django.DjangoModelFactory):
    """A GPU of a catalog product (``product_key``); H100 SXM5 80GB by default."""

    class Meta:
        model = Gpu

    class Params:
        product = factory.LazyAttribute(lambda o: product_by_key(o.product_key))

    host = factory.SubFactory(HostFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-00000000-0000-0000-0000-{n:012d}")
    product_key = "h100-sxm5-80gb"
    product_name = factory.LazyAttribute(lambda o: o.product.name)
    memory_mib = factory.LazyAttribute(lambda o: o.product.memory_mib)
    pci_device_id = factory.LazyAttribute(
        lambda o: (o.product.pci_device_ids[0] << 16) | 0x10DE if o.product.pci_device_ids else 0
    )
    mig_capable = factory.LazyAttribute(lambda o: o.product.mig_capable)
    health = GpuHealth.HEALTHY

    @classmethod
    def _create(cls, model_class, *args, **kwargs):  # type: ignore[no-untyped-def]
        host = kwargs["host"]
        taken = set(Gpu.objects.filter(host=host).values_list("index", flat=True))
        while kwargs["index"] in taken:
            kwargs["index"] += 1
        return super()._create(model_class, *args, **kwargs)


def dedicated_gpus(host: Host, count: int, product_key: str = "h100-sxm5-80gb") -> list[Gpu]:
    """``count`` GPUs of the host, each laid out whole (dedicated), in index order."""
    from fleet.partitioning.services import LayoutSpec, gpu_set_layout

    gpus = [GpuFactory(host=host, product_key=product_key) for _ in range(count)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpus


def allow_process(team: Any = None, user: str = "1000:1000", **policy: Any) -> Any:
    """Give ``team`` (default: the ``default`` team) a policy that allows process workloads,
    run as ``user``, plus any other ``policy`` keys; returns the team."""
    from fleet.core.models import Team, default_team_id

    team = team if team is not None else Team.objects.get(pk=default_team_id())
    team.policy = {"runtimes": ["container", "process"], "process_user": user, **policy}
    team.save(update_fields=["policy"])
    return team


def webhook(url: str, events: list[str], secret: str = "s" * 16, **fields: Any) -> Any:
    """An alert webhook row as the API stores one: its URL and secret encrypted, the URL's
    shown part in the clear."""
    from fleet.core.models import AlertWebhook
    from fleet.core.redaction import url_shown
    from fleet.core.secrets import secret_encrypt

    return AlertWebhook.objects.create(
        url=url_shown(url),
        url_ciphertext=secret_encrypt(url),
        secret_ciphertext=secret_encrypt(secret),
        events=events,
        **fields,
    )
