"""provider.yaml is the one metadata source: get_provider_info() reads it from the package."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import jsonschema
import yaml

import airflow_provider_dlq
from airflow_provider_dlq.get_provider_info import get_provider_info

ROOT = Path(__file__).resolve().parents[2]


def test_provider_info_is_the_packaged_provider_yaml():
    packaged = Path(airflow_provider_dlq.__file__).parent / "provider.yaml"
    assert get_provider_info() == yaml.safe_load(packaged.read_text(encoding="utf-8"))


def test_provider_info_validates_against_airflows_schema():
    import airflow

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_version_and_docs_paths_are_true():
    info = get_provider_info()
    assert info["versions"][0] == airflow_provider_dlq.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{airflow_provider_dlq.__version__}"' in pyproject
    guides = info["integrations"][0]["how-to-guide"]
    assert guides
    for guide in guides:
        assert (ROOT / guide.lstrip("/")).is_file(), f"{guide} named in provider.yaml does not exist"


def test_link_classes_import():
    for path in get_provider_info()["extra-links"]:
        module, _, name = path.rpartition(".")
        assert getattr(importlib.import_module(module), name)


def test_report_plugin_loads_with_lazy_provider_discovery():
    """The plugin is an entry-point plugin: Airflow loads it with its default lazy provider discovery
    (provider-info plugins load only with lazy_discover_providers off), and it is listed once."""
    from airflow import plugins_manager, settings

    assert settings.LAZY_LOAD_PROVIDERS
    assert "plugins" not in get_provider_info()
    plugins_manager._get_plugins.cache_clear()
    plugins, errors = plugins_manager._get_plugins()
    names = [p.name for p in plugins]
    assert names.count("dlq_replay") == 1, (names, errors)
    (plugin,) = [p for p in plugins if p.name == "dlq_replay"]
    assert plugin.fastapi_apps[0]["url_prefix"] == "/dlq-replay"


def test_airflow_discovers_links_plugin_and_form_behaviour():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "airflow_provider_dlq.operators.links.DlqReplayReportLink" in manager.extra_links_class_names
    behaviour = manager.field_behaviours["pulsar"]
    assert behaviour["relabeling"]["host"] == "Service URL"
    assert "extra__pulsar__test_topic" in manager.connection_form_widgets


def _project_urls() -> dict[str, str]:
    import importlib.metadata

    entries = importlib.metadata.metadata("airflow-provider-dlq").get_all("Project-URL") or []
    return {name.strip(): url.strip() for name, _, url in (e.partition(",") for e in entries)}


def test_every_docs_link_the_provider_declares_opens():
    """How-to guides are files in docs/; external links are declared project URLs; Airflow's
    documentation-url (the providers page link) is the plugin's docs route, which serves every guide."""
    from airflow.providers_manager import ProvidersManager
    from fastapi.testclient import TestClient

    from airflow_provider_dlq.plugins.reports import create_app
    from airflow_provider_dlq.resources import docs_dir

    urls = _project_urls()
    info = get_provider_info()
    documentation_url = ProvidersManager().providers["airflow-provider-dlq"].data["documentation-url"]
    assert documentation_url == urls["Documentation"] == "/dlq-replay/docs/"
    client = TestClient(create_app())
    prefix = "/dlq-replay"
    index = client.get(documentation_url.removeprefix(prefix))
    assert index.status_code == 200
    guides = [g for integration in info["integrations"] for g in integration.get("how-to-guide", [])]
    assert guides
    for guide in guides:
        assert guide.startswith("/docs/"), guide
        assert (docs_dir() / guide.removeprefix("/docs/")).is_file(), guide
        assert f"href='{guide.removeprefix('/docs/')}'" in index.text
        page = client.get(guide)
        assert page.status_code == 200, guide
        assert page.headers["content-type"].startswith("text/plain")
        assert page.text == (ROOT / guide.lstrip("/")).read_text(encoding="utf-8")
    for integration in info["integrations"]:
        external = integration.get("external-doc-url")
        assert external is None or external in urls.values(), f"{external} is not a declared project URL"
    assert client.get("/docs/..%2Fpyproject.toml").status_code == 404
    assert client.get("/docs/nope.md").status_code == 404
