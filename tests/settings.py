"""Test settings: the real stack (PostgreSQL, Redis) with fast hashing and
an in-memory mailbox. ``scripts/with-services.sh`` provides the URLs."""

import getpass
import os

os.environ.setdefault("SECRET_KEY", "test-only-not-secret")
# The Fernet key of the tickets' signing keys (docs/door.md, "Keys and rotation").
os.environ.setdefault("TICKET_KEY_SECRETS", "dGVzdC1vbmx5LXRpY2tldC1rZXktbm90LXNlY3JldCE=")
os.environ.setdefault("FAKE_GATEWAY_ENABLED", "true")
os.environ.setdefault("DATABASE_URL", f"postgres://{getpass.getuser()}@127.0.0.1:5432/boxoffice")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
# One queue per test session, so that nothing a concurrent `make run` (or
# another test session) enqueues meets our workers, and the other way round.
os.environ.setdefault("CELERY_TASK_DEFAULT_QUEUE", f"boxoffice-test-{os.getpid()}")
# The same for the cache's keys (the end-to-end stack's processes inherit it).
os.environ.setdefault("TEST_CACHE_KEY_PREFIX", f"boxoffice-test-{os.getpid()}")
os.environ.setdefault("PAYMENT_GATEWAY_TIMEOUT_SECONDS", "1.0")
os.environ.setdefault("FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS", "1.5")
# Off: many tests make the processor time out on purpose, one after another,
# and would trip it; tests/test_breaker.py turns it on.
os.environ.setdefault("PAYMENT_BREAKER_ENABLED", "false")
os.environ.setdefault("PURCHASE_THROTTLE_RATE", "100000/min")
os.environ.setdefault("AUTH_TOKEN_THROTTLE_RATE", "100000/min")

from config.settings import *  # noqa: E402,F403

# The cache on Redis, as on the real stack: the catalog is served from it
# (purchases/availability.py), and the worker's invalidations must reach the
# web process. Never cleared by a test: that would flush the Redis database
# other sessions share; tests/test_catalog_cache.py takes a prefix per test.
if "CACHE_URL" not in os.environ:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
        }
    }
CACHES["default"]["KEY_PREFIX"] = os.environ["TEST_CACHE_KEY_PREFIX"]  # noqa: F405

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
LOGGING["root"]["level"] = "WARNING"  # noqa: F405

# pytest's caplog listens on the root logger: let ours propagate to it (the
# product's loggers stop at their own handler so a line is not printed twice).
for _logger in LOGGING["loggers"].values():  # noqa: F405
    _logger["propagate"] = True
    _logger["handlers"] = []

# Unit tests deliver the outbox through the relay (``drain_outbox``), one
# pass at a time; the stack's processes (tests/stack.py) hand rows over on
# commit as production does, and the tests of that path turn it on.
OUTBOX_HAND_OVER_ON_COMMIT = os.environ.get("OUTBOX_HAND_OVER_ON_COMMIT", "false") == "true"
