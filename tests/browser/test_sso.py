"""A person signs in through the identity provider's own page (OIDC) and lands on the
dashboard with the team role their group maps to (tests/sso holds the provider)."""

from __future__ import annotations

import pytest

from tests.sso.oidc_provider import USERS, running_provider

pytestmark = pytest.mark.browser


def test_signing_in_through_the_provider_lands_on_the_dashboard_with_the_mapped_team_role(
    stack, chromium, tmp_path
):
    port = int(stack.env["FLEET_OIDC_ISSUER"].rsplit(":", 1)[1].split("/")[0])
    callback = f"{stack.url}/oidc/callback/"
    with running_provider(tmp_path / "idp", [callback], port=port):
        page = chromium.new_page()
        page.goto(stack.url + "/login/")
        page.click("#sso-oidc")  # "Sign in with Test IdP"
        page.wait_for_selector("#idp-sign-in")  # the provider's own page
        page.fill("#id_username", "dana")
        page.fill("#id_password", USERS["dana"]["password"])
        page.click("#idp-sign-in")
        page.wait_for_url(stack.url + "/")

        assert page.inner_text(".whoami").lower().split() == ["d", "dana", "member"]
        # team-search -> operator of the team "search": dana may create its deployments.
        assert page.locator('[data-action="new-deployment"]').is_visible()
        assert page.get_attribute("body", "data-can-operate") == "0"
        page.close()
