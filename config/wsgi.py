import os

from django.core.wsgi import get_wsgi_application
from django.urls import Resolver404, resolve

from config import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before the application loads its middleware: the Django instrumentation
# adds its own. Nothing at all unless OTEL_* variables ask for traces
# (config/tracing.py); runserver loads this module too.
tracing.tracing_init(instrument=tracing.WEB)
application = get_wsgi_application()
# The URLconf, and the views and apps it imports, load at a process's first
# request otherwise: about a second of CPU with the GIL held while that
# request and its neighbours wait, after every deploy or restart (bench
# figure 10's profile of an on-sale right after one: 15 % of the web's
# samples). Load them as the process starts, before it takes a request:
# resolving any path imports the URLconf and every module it names (the
# fake processor serves its own URLconf through this module too).
try:
    resolve("/")
except Resolver404:
    pass  # no route at the root: the URLconf is loaded all the same
