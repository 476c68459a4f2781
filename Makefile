# Fleet: `make run` runs the product on embedded defaults, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The dashboard's tools (axe-core, typescript, prettier), exactly as package-lock.json pins them.
NODE_BIN := node_modules/.bin
NODE_STAMP := node_modules/.package-lock.json

.PHONY: run test test-production test-fast check check-deploy check-image format lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(NODE_STAMP): package-lock.json
	npm ci --no-audit --no-fund

## run: migrate, seed a demo fleet, print a login and serve on http://127.0.0.1:8000
run: $(STAMP)
	$(BIN)/python manage.py demo

# pytest-xdist workers for the non-browser tests (each has its own test database and Redis
# database; the tests that start real processes run one after another on one of them).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

## test: every test: pure domain, Django, API, agent, end-to-end (PostgreSQL-only ones need
## FLEET_DATABASE_URL/FLEET_REDIS_URL), then the real-browser tests in their own process
test: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -m "not browser" $(XDIST) --durations=25
	$(BIN)/pytest -p no:cacheprovider -m browser tests/browser

## test-production: the tests that meet PostgreSQL and Redis (FLEET_DATABASE_URL/FLEET_REDIS_URL
## set): everything but the pure domain, the agent and the tests marked pure, which touch neither
## and ran in `make test`
test-production: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -m "not browser and not pure" $(XDIST) --durations=25 \
	  --ignore=tests/hostagent --ignore=tests/mig --ignore=tests/mps --ignore=tests/placement \
	  --ignore=tests/gpu

## check: lint, types, import contracts, migrations, the OpenAPI schema, the docs (mkdocs --strict)
## and the dashboard's JavaScript and CSS (every file // @ts-check, checked by tsc; prettier's layout)
check: $(STAMP) $(NODE_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy fleet hostagent manage.py
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null
	$(BIN)/mkdocs build --strict --site-dir site
	@unchecked=$$(grep -rL --include='*.js' '^// @ts-check' static); \
	  if [ -n "$$unchecked" ]; then echo "no // @ts-check in: $$unchecked"; exit 1; fi
	$(NODE_BIN)/tsc -p jsconfig.json
	$(NODE_BIN)/prettier --check 'static/**/*.{js,css}'

## format: lay out the Python (ruff) and the dashboard's JavaScript and CSS (prettier) in place
format: $(STAMP) $(NODE_STAMP)
	$(BIN)/ruff format .
	$(NODE_BIN)/prettier --write --log-level warn 'static/**/*.{js,css}'

## check-deploy: the deployment files: systemd-analyze verify on every unit (deploy/systemd,
## hostagent/packaging), nginx -t on deploy/nginx/fleet.conf, caddy validate on
## deploy/caddy/Caddyfile (Debian's systemd, nginx and caddy packages; .ci/run installs them)
check-deploy:
	deploy/check.sh

## check-image: build the container image (Dockerfile) on a Debian base made
## here with debootstrap (cached in /var/cache/fleet-ci) and smoke-test its web and worker
## against PostgreSQL and Redis (tests/deploy/test_image.py); root and dockerd
check-image: $(STAMP)
	deploy/container/check.sh

clean:
	rm -rf $(VENV) node_modules var site .pytest_cache .mypy_cache .ruff_cache .hypothesis
