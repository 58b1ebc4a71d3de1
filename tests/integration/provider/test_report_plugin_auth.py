"""The report endpoint on Airflow's own API app: anonymous requests are refused, signed-in users served.

(The UI test's stack runs the all-admins auth manager, which authorises every request, so the refusal is
proven here with the default simple auth manager.)
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

URL = "/dlq-replay/reports/some_dag/some_run/replay/-1"


@pytest.fixture
def api_client(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-test-only-secret-" + "x" * 48)
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from fastapi.testclient import TestClient

    app = create_app("core")
    return TestClient(app), get_auth_manager()


def test_report_endpoint_requires_a_signed_in_user(api_client):
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    client, auth_manager = api_client
    anonymous = client.get(URL)
    assert anonymous.status_code == 401
    token = auth_manager.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    signed_in = client.get(URL, headers={"Authorization": f"Bearer {token}"})
    # Authorised: the endpoint answers itself (no such task instance), with its no-script policy.
    assert signed_in.status_code == 404
    assert "default-src 'none'" in signed_in.headers["content-security-policy"]
    assert "DLQ replay report unavailable" in signed_in.text
