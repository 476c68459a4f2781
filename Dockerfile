# Fleet's server image: one image, its role chosen by its command (deploy/container/entrypoint):
#   web (daphne on $FLEET_PORT, 8000), worker (Celery), beat (Celery beat, exactly one),
#   migrate (migrations; run it once before the others after an upgrade), gateway (the
#   endpoints' HAProxy, started as its child and kept in step: docs/endpoints.md), manage ARGS...
# Settings come from the environment (docs/install.md: FLEET_MODE=production, FLEET_SECRET_KEY,
# FLEET_SECRETS_KEY, FLEET_DATABASE_URL, FLEET_REDIS_URL, FLEET_ALLOWED_HOSTS ...).
#   docker build -t fleet .          (deploy/compose/compose.yaml runs every role)
# The base is an argument: Python 3.11+ with venv (CI builds one from Debian's packages with
# debootstrap, as it cannot pull images: deploy/container/check.sh).
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
# Optional: the CA bundle pip trusts (deploy/container/check.sh passes the base's system bundle).
ARG PIP_CERT
# The wheel of this tree (templates and static files inside, setup.py) and its dependencies,
# in a virtual environment the runtime stage copies as is (same base, same Python path).
COPY . /src
RUN python3 -m venv /opt/fleet/venv \
    && /opt/fleet/venv/bin/pip install --no-cache-dir --disable-pip-version-check --quiet /src \
    && find /opt/fleet/venv -name __pycache__ -prune -exec rm -rf {} + \
    # The static files, collected once into the image as production names them (hashed, with
    # a manifest): WhiteNoise serves them in every web container. Placeholder settings:
    # collectstatic connects to no database or Redis and signs nothing.
    && FLEET_MODE=production FLEET_DATA_DIR=/opt/fleet/data FLEET_SECRET_KEY=collectstatic-only \
       FLEET_SECRETS_KEY=MDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDA= \
       FLEET_DATABASE_URL=postgres://unused/unused FLEET_REDIS_URL=redis://unused:6379/0 \
       FLEET_ALLOWED_HOSTS=unused DJANGO_SETTINGS_MODULE=fleet.settings.base \
       /opt/fleet/venv/bin/django-admin collectstatic --noinput -v0

FROM ${BASE}
# HAProxy for the gateway role (Debian's package; its service is not started in a container).
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy \
       >/dev/null \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
RUN (getent group fleet || groupadd --system --gid 10001 fleet) \
    && (id fleet || useradd --system --uid 10001 --gid fleet --home-dir /var/lib/fleet \
        --shell /usr/sbin/nologin fleet) \
    && mkdir -p /var/lib/fleet && chown fleet:fleet /var/lib/fleet
COPY --from=build /opt/fleet/venv /opt/fleet/venv
# FLEET_DATA_DIR/static is STATIC_ROOT: read-only here, the image's own.
COPY --from=build /opt/fleet/data/static /var/lib/fleet/static
COPY deploy/container/entrypoint /usr/local/bin/fleet-container
ENV PATH=/opt/fleet/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DJANGO_SETTINGS_MODULE=fleet.settings.base \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLEET_MODE=production \
    FLEET_DATA_DIR=/var/lib/fleet
USER fleet:fleet
WORKDIR /var/lib/fleet
# web: 8000; gateway: 8080 (its --listen).
EXPOSE 8000 8080
ENTRYPOINT ["/usr/local/bin/fleet-container"]
CMD ["web"]
