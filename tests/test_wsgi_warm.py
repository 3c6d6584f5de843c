"""gunicorn's worker loads ``config.wsgi`` as it starts: the URLconf and the
views it names load then, not in the worker's first requests. The fake
processor is served through the same module with its own URLconf."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "urlconf, modules",
    [
        (None, ("config.urls", "purchases.apis", "drf_spectacular.views")),
        ("payments.fake_gateway.standalone_urls", ("payments.fake_gateway.standalone_urls",)),
    ],
)
def test_loading_the_wsgi_application_loads_the_urlconf_and_its_views(urlconf, modules):
    env = {
        k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "ROOT_URLCONF")
    }
    if urlconf is not None:
        env["ROOT_URLCONF"] = urlconf
    code = f"import sys, config.wsgi; print(*(m in sys.modules for m in {modules!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[-len(modules) :] == ["True"] * len(modules), out
