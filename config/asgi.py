import os

from django.core.asgi import get_asgi_application

from config import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# As config/wsgi.py: before the application loads its middleware, and
# nothing at all unless OTEL_* variables ask for traces (config/tracing.py).
tracing.tracing_init(instrument=tracing.WEB)
application = get_asgi_application()
