"""gunicorn's worker loads ``config.wsgi`` as it starts: the URLconf and the
views it names load then, not in the worker's first requests."""

import os
import subprocess
import sys


def test_loading_the_wsgi_application_loads_the_urlconf_and_its_views():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    modules = ("config.urls", "purchases.apis", "drf_spectacular.views")
    code = f"import sys, config.wsgi; print(*(m in sys.modules for m in {modules!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[-3:] == ["True", "True", "True"], out
