import os

from django.core.wsgi import get_wsgi_application

from config import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before the application loads its middleware: the Django instrumentation
# adds its own. Nothing at all unless OTEL_* variables ask for traces
# (config/tracing.py); runserver loads this module too.
tracing.tracing_init(instrument=tracing.WEB)
application = get_wsgi_application()
