"""The product's settings plus the statement counter (bench/sqlcount): the
settings module of the processes of figure 2's count run only."""

from config.settings import *  # noqa: F401,F403
from config.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.sqlcount"]
