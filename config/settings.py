"""Settings, read from the environment (12-factor).

Every variable an operator may change is documented in docs/operations.md. The
database is PostgreSQL, always, named by ``DATABASE_URL`` (``make run`` and
``make manage`` start an embedded one when the shell sets none, and pass its
URL); with no ``CELERY_BROKER_URL`` the broker is kombu's filesystem transport
under ``var/``, which needs no server.
"""

from pathlib import Path
from typing import Any

import environ

from purchases.saga.topics import REFUND_QUEUE_TOPICS, ROUTING
from webhooks.topics import DELIVERY as WEBHOOK_DELIVERY
from webhooks.topics import ROUTING as WEBHOOK_ROUTING

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("BOXOFFICE_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
_INSECURE_KEY = "django-insecure-boxoffice-embedded-only"
SECRET_KEY = env.str("SECRET_KEY", default=_INSECURE_KEY if DEBUG else "")
if not SECRET_KEY:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
# The Fernet keys that encrypt each event's ticket signing key at rest
# (docs/door.md, "Keys and rotation"): comma-separated, the first encrypts,
# every one decrypts (so a new one goes first, the old stays until
# re-encrypted). Like SECRET_KEY: a fixed development key in DEBUG only.
_INSECURE_TICKET_KEY = "Ym94b2ZmaWNlLWRldmVsb3BtZW50LW9ubHkta2V5ISE="
TICKET_KEY_SECRETS = env.list("TICKET_KEY_SECRETS", default=[_INSECURE_TICKET_KEY] if DEBUG else [])
if not TICKET_KEY_SECRETS:
    from django.core.exceptions import ImproperlyConfigured  # only for this refusal

    raise ImproperlyConfigured("TICKET_KEY_SECRETS must be set when DEBUG is off")
try:
    # Refused at start-up, not at the first ticket shown.
    from cryptography.fernet import Fernet  # only for this check

    for _secret in TICKET_KEY_SECRETS:
        Fernet(_secret.strip().encode())
except ValueError:
    from django.core.exceptions import ImproperlyConfigured  # only for this refusal

    raise ImproperlyConfigured(
        "TICKET_KEY_SECRETS takes Fernet keys (32 url-safe base64-encoded bytes), comma-separated"
    ) from None
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
PORT = env.int("PORT", default=8000)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    # Swagger UI and ReDoc served from static files: the docs work offline.
    "drf_spectacular_sidecar",
    "outbox",
    "ledger",
    "payments",
    "payments.fake_gateway",
    # Sellers and their members' roles (below purchases and webhooks, which refer to it).
    "organizers",
    "purchases",
    "webhooks",
    # htmx for the buyer pages, served from its static files (no CDN).
    "django_htmx",
    # The buyer pages: templates on the same services and selectors as the API.
    "shop",
    # Sign-up (the API and a page) and the password reset pages.
    "accounts",
    # The sellers' box office: events as data, reads and pages.
    "seller",
    # Stripe's signed events: the endpoint, the inbox, the consumer (docs/stripe.md).
    "stripe_events",
    # The door: signed ticket codes, event keys and check-in (docs/door.md).
    "door",
]

MIDDLEWARE = [
    # First: it decides whether this request checks its connection.
    "config.middleware.BusyConnectionMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.RequestSizeLimitMiddleware",
    # Serves the admin's static files under gunicorn (collectstatic first).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.htmx: the purchase page's poll is told from a page load.
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
# The fake gateway's own process serves only its URLs
# (payments.fake_gateway.standalone_urls, docker-compose.yml's gateway service).
ROOT_URLCONF = env.str("ROOT_URLCONF", default=ROOT_URLCONF)
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------
# PostgreSQL, named by DATABASE_URL, and nothing picked in its absence: make run
# and make manage start the embedded one (devtools/embedded_pg.py) and set it
# (docs/operations.md, "make run"); make test finds or starts one.
if "DATABASE_URL" not in env:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "DATABASE_URL is not set: the URL of a PostgreSQL database (make run and make manage"
        ' set it to their embedded PostgreSQL; docs/operations.md, "Settings")'
    )
DATABASES: dict[str, dict[str, Any]] = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"DATABASE_URL names {DATABASES['default']['ENGINE']}: boxoffice runs on PostgreSQL"
        " only (postgres://user@host:port/name)"
    )
# Django's, without GROUP BY the primary key alone (config/postgresql).
DATABASES["default"]["ENGINE"] = "config.postgresql"
DATABASES["default"].setdefault("OPTIONS", {})
# psycopg 3's protocol mode (make bench measures both, docs/performance.md):
# parameters bound by the client into the SQL text (Django's default), or
# sent apart and bound by the server, with statements prepared after
# DB_PREPARE_THRESHOLD executions on a connection.
if env.bool("DB_SERVER_SIDE_BINDING", default=False):
    DATABASES["default"]["OPTIONS"]["server_side_binding"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = env.int(
        "DB_PREPARE_THRESHOLD", default=5
    )
# A PostgreSQL host that stops answering (rather than refusing) fails a
# connection after this long, not the system's TCP timeout: /metrics and
# /readyz answer within a scrape (purchases/ops/). libpq's option.
DATABASES["default"]["OPTIONS"].setdefault(
    "connect_timeout", env.int("DB_CONNECT_TIMEOUT_SECONDS", default=5)
)
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# ... but only for a connection idle for this long (or one that errored): a
# busy one is taken as alive (config/middleware.py, config/celery.py).
DB_IDLE_CHECK_AFTER_SECONDS = env.float("DB_IDLE_CHECK_AFTER_SECONDS", default=5.0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- cache: the throttles' counts and the catalog (purchases/availability.py) ------
# Shared by every process: Redis through CACHE_URL on the real stack; by
# default files under VAR_DIR, which every process of one machine sees (the
# embedded mode of make run: the worker's invalidations reach the web process).
CACHES = {"default": env.cache_url("CACHE_URL", default=f"filecache://{VAR_DIR / 'cache'}")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
    # A cache that stops answering (a cut link, not a refusal) is a cache
    # down after this long, not a request stuck for the system's TCP timeout:
    # what a request needs of it falls back to the database
    # (purchases/cache_outage.py).
    CACHES["default"].setdefault("OPTIONS", {}).update(
        socket_connect_timeout=env.float("CACHE_SOCKET_TIMEOUT_SECONDS", default=1.0),
        socket_timeout=env.float("CACHE_SOCKET_TIMEOUT_SECONDS", default=1.0),
    )
# A cache found down is not asked again for this long (purchases/cache_outage.py).
CACHE_RETRY_SECONDS = env.float("CACHE_RETRY_SECONDS", default=5.0)

# --- auth, i18n, static -----------------------------------------------------
# The buyer pages' session login (shop/): asked for at Buy and on the purchase pages; the
# events and their seat maps are public.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Django's four, as its project template sets them: judged at sign-up
# (accounts/), at a password reset and in the admin's password forms.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns about a missing one

# --- REST API ---------------------------------------------------------------
# How long a token that authenticated is remembered with its user in the cache
# (purchases/authentication.py): deleting the token or saving its user forgets
# it at once; this bounds what no signal sees (a bulk UPDATE). 0: no cache.
AUTH_TOKEN_CACHE_SECONDS = env.int("AUTH_TOKEN_CACHE_SECONDS", default=60)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # DRF's, with the token's user remembered in the cache (below).
        "purchases.authentication.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 20,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Every exception Django or DRF raises, in the one error shape (docs/api.md, "Errors").
    "EXCEPTION_HANDLER": "common.api.exception_handler",
    # JSON only (docs/api.md), nested at most MAX_JSON_DEPTH deep.
    "DEFAULT_PARSER_CLASSES": ["common.parsers.JSONParser"],
    # DRF's, the commonest Accept headers answered without parsing them.
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.negotiation.ContentNegotiation",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "boxoffice",
    "DESCRIPTION": "Numbered seats sold through orchestrated purchase sagas.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ and /api/redoc/ load their scripts from this service, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No badge from validator.swagger.io: nothing on the page leaves the service.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # Clients are generated from this document
    # (docs/api.md, "Schema and docs"): separate request and response
    # components, so that a field the server writes (the token, an id) is
    # never asked of the client.
    "COMPONENT_SPLIT_REQUEST": True,
    # One name per choice set, the same wherever it is used.
    "ENUM_NAME_OVERRIDES": {
        "PurchaseStatus": "purchases.serializers.PURCHASE_STATUSES",
        "PaymentStatus": "purchases.selectors.PAYMENT_STATUSES",
        "SeatStatus": "purchases.models.SeatStatus",
        "RefundStatus": "purchases.serializers.REFUND_STATUSES",
        "TicketStatus": "purchases.serializers.TICKET_STATUSES",
        "ScanResult": "door.serializers.RESULTS",
    },
}

# --- the product ------------------------------------------------------------
PURCHASE_HOLD_SECONDS = env.int("PURCHASE_HOLD_SECONDS", default=900)
RECONCILE_BACKOFF_SECONDS = [
    int(s)
    for s in env.list(
        "RECONCILE_BACKOFF_SECONDS", default=["60", "120", "240", "480", "960", "1920"]
    )
]
RESUME_AFTER_SECONDS = env.int("RESUME_AFTER_SECONDS", default=300)
COMPENSATION_DEADLINE_SECONDS = env.int("COMPENSATION_DEADLINE_SECONDS", default=86400)
# Money back (docs/refunds.md): an event's cancellation asks the processor
# for this many refunds per second; a refund still not settled this long
# after it was asked for alerts an operator.
REFUND_RATE_PER_SECOND = env.float("REFUND_RATE_PER_SECOND", default=20.0)
if REFUND_RATE_PER_SECOND <= 0:
    from django.core.exceptions import ImproperlyConfigured  # only for this refusal

    raise ImproperlyConfigured("REFUND_RATE_PER_SECOND must be above 0")
REFUND_CHASE_SECONDS = env.int("REFUND_CHASE_SECONDS", default=COMPENSATION_DEADLINE_SECONDS)
MAX_SEATS_PER_PURCHASE = env.int("MAX_SEATS_PER_PURCHASE", default=10)
# 20 at most: a purchase's total, up to this many seats at the highest price
# a seller may set (seller/seat_maps.py, PRICE_MAX), fits its integer columns.
if not 1 <= MAX_SEATS_PER_PURCHASE <= 20:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("MAX_SEATS_PER_PURCHASE must be 1 to 20")
# Purchase starts per user (DRF rate syntax: N/s, N/min, N/hour, N/day).
PURCHASE_THROTTLE_RATE = env.str("PURCHASE_THROTTLE_RATE", default="60/min")
# Attempts at POST /api/auth/token/ per client address (password guessing).
AUTH_TOKEN_THROTTLE_RATE = env.str("AUTH_TOKEN_THROTTLE_RATE", default="30/min")
# Request bodies above this answer 413 before anything parses them.
MAX_REQUEST_BYTES = env.int("MAX_REQUEST_BYTES", default=16 * 1024)
# Deeper JSON bodies answer 400 parse_error (common/parsers.py). The API's
# deepest body nests 2 levels; 64 leaves room for what it may take later,
# while every recursive walk of the parsed data stays far below Python's
# recursion limit (1000 frames).
MAX_JSON_DEPTH = env.int("MAX_JSON_DEPTH", default=64)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(MAX_REQUEST_BYTES, 2_621_440)
DEMO_PASSWORD = env.str("DEMO_PASSWORD", default="boxoffice")

# --- the catalog's availability cache (purchases/availability.py) -----------------
# A change whose invalidation was lost (a cache or broker restart) is shown at
# most this long after its commit; one whose invalidation arrived, at once.
AVAILABILITY_MAX_STALE_SECONDS = env.int("AVAILABILITY_MAX_STALE_SECONDS", default=2)
# off: the catalog reads the database on every request and the saga announces
# no change. For make bench's comparison only (docs/performance.md).
AVAILABILITY_CACHE = env.bool("AVAILABILITY_CACHE", default=True)

# The gateway adapter's base URL; by default the fake gateway mounted on this
# very service.
PAYMENT_GATEWAY_URL = env.str(
    "PAYMENT_GATEWAY_URL", default=f"http://127.0.0.1:{PORT}/fake-gateway/v1"
).rstrip("/")
# Short on purpose: a timeout is UNKNOWN, which is reconciled safely, while a
# worker blocked on a slow processor holds up every purchase behind it.
PAYMENT_GATEWAY_TIMEOUT_SECONDS = env.float("PAYMENT_GATEWAY_TIMEOUT_SECONDS", default=2.0)
# The circuit breaker on the processor (purchases/breaker.py, docs/operations.md,
# "Payments paused"): this many unknown answers in a row (timeouts, connection
# errors, 5xx; never declines) open it, and new purchases are refused with
# 503 payments_paused for the reset time; the first answer after it is the trial.
PAYMENT_BREAKER_ENABLED = env.bool("PAYMENT_BREAKER_ENABLED", default=True)
PAYMENT_BREAKER_FAILURES = env.int("PAYMENT_BREAKER_FAILURES", default=10)
PAYMENT_BREAKER_RESET_SECONDS = env.float("PAYMENT_BREAKER_RESET_SECONDS", default=30.0)
# How often beat makes the trial (one look-up) of a breaker open past its reset time.
PAYMENT_BREAKER_TRIAL_SECONDS = env.float("PAYMENT_BREAKER_TRIAL_SECONDS", default=5.0)
if (
    PAYMENT_BREAKER_FAILURES < 1
    or PAYMENT_BREAKER_RESET_SECONDS <= 0
    or PAYMENT_BREAKER_TRIAL_SECONDS <= 0
):
    from django.core.exceptions import ImproperlyConfigured  # only for this refusal

    raise ImproperlyConfigured(
        "PAYMENT_BREAKER_FAILURES must be at least 1, PAYMENT_BREAKER_RESET_SECONDS and "
        "PAYMENT_BREAKER_TRIAL_SECONDS above 0"
    )
# The on-sale waiting room (purchases/admission.py, docs/waiting-room.md): an
# event published with at least this many seats and no setting of its own
# sells through one.
WAITING_ROOM_MIN_SEATS = env.int("WAITING_ROOM_MIN_SEATS", default=2000)
# How often beat ticks every room (the draw, the admissions).
WAITING_ROOM_TICK_SECONDS = env.float("WAITING_ROOM_TICK_SECONDS", default=1.0)
# How long a buyer let in may start a purchase (their pass's life).
WAITING_ROOM_PASS_SECONDS = env.int("WAITING_ROOM_PASS_SECONDS", default=120)
# The charges waiting are kept within what the measured rate serves in this
# share of the event's hold.
WAITING_ROOM_HOLD_SHARE = env.float("WAITING_ROOM_HOLD_SHARE", default=0.5)
# The charge rate (per second) is measured over this window, and taken to be
# at least the floor when fewer charges were made (a sale just opening).
WAITING_ROOM_RATE_WINDOW_SECONDS = env.int("WAITING_ROOM_RATE_WINDOW_SECONDS", default=30)
WAITING_ROOM_MIN_CHARGE_RATE = env.float("WAITING_ROOM_MIN_CHARGE_RATE", default=5.0)
if (
    WAITING_ROOM_MIN_SEATS < 0
    or WAITING_ROOM_TICK_SECONDS <= 0
    or WAITING_ROOM_PASS_SECONDS < 1
    or not 0 < WAITING_ROOM_HOLD_SHARE <= 1
    or WAITING_ROOM_RATE_WINDOW_SECONDS < 1
    or WAITING_ROOM_MIN_CHARGE_RATE <= 0
):
    from django.core.exceptions import ImproperlyConfigured  # only for this refusal

    raise ImproperlyConfigured(
        "WAITING_ROOM_MIN_SEATS must be at least 0, WAITING_ROOM_TICK_SECONDS and "
        "WAITING_ROOM_MIN_CHARGE_RATE above 0, WAITING_ROOM_PASS_SECONDS and "
        "WAITING_ROOM_RATE_WINDOW_SECONDS at least 1, WAITING_ROOM_HOLD_SHARE in (0, 1]"
    )
# The fake gateway: on by default outside production (DEBUG), or when asked.
FAKE_GATEWAY_ENABLED = env.bool("FAKE_GATEWAY_ENABLED", default=DEBUG)
# How long the fake sleeps to make the adapter time out; must exceed the
# adapter's timeout.
FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = env.float(
    "FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS", default=PAYMENT_GATEWAY_TIMEOUT_SECONDS + 1.0
)
FAKE_GATEWAY_LATENCY_MS = env.int("FAKE_GATEWAY_LATENCY_MS", default=0)
# Share (0..1) of successful charges whose answer the fake loses after
# charging, whatever the payment method (the chaos suite sets 0.3).
FAKE_GATEWAY_CHAOS_TIMEOUT_RATE = env.float("FAKE_GATEWAY_CHAOS_TIMEOUT_RATE", default=0.0)

# --- the processor: the fake gateway or Stripe (docs/stripe.md) -----------------
# fake: the fake gateway above (payments/gateway.py); stripe: Stripe through
# its official library (payments/stripe/).
PAYMENT_GATEWAY = env.str("PAYMENT_GATEWAY", default="fake")
if PAYMENT_GATEWAY not in ("fake", "stripe"):
    # Read at start-up: a misspelt processor must not fall back to the fake.
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("PAYMENT_GATEWAY must be fake or stripe")
STRIPE_SECRET_KEY = env.str("STRIPE_SECRET_KEY", default="")
STRIPE_PUBLISHABLE_KEY = env.str("STRIPE_PUBLISHABLE_KEY", default="")
STRIPE_WEBHOOK_SECRET = env.str("STRIPE_WEBHOOK_SECRET", default="")
# Stripe's own by default; localstripe's for tests and make run's Stripe mode.
STRIPE_API_BASE = env.str("STRIPE_API_BASE", default="https://api.stripe.com").rstrip("/")
STRIPE_JS_URL = env.str("STRIPE_JS_URL", default="https://js.stripe.com/v3/")
# A Stripe call that has not answered within this long is UNKNOWN (reconciled).
STRIPE_TIMEOUT_SECONDS = env.float("STRIPE_TIMEOUT_SECONDS", default=10.0)
# How old a Stripe-Signature's timestamp may be (Stripe's own default).
STRIPE_WEBHOOK_TOLERANCE_SECONDS = env.int("STRIPE_WEBHOOK_TOLERANCE_SECONDS", default=300)
if PAYMENT_GATEWAY == "stripe":
    # Refused at start-up, not at the first purchase (docs/stripe.md, "Settings").
    from payments.stripe.keys import check_stripe_settings

    check_stripe_settings(
        secret_key=STRIPE_SECRET_KEY,
        publishable_key=STRIPE_PUBLISHABLE_KEY,
        webhook_secret=STRIPE_WEBHOOK_SECRET,
    )

# --- outgoing webhooks (docs/api.md) -------------------------------------------
# A receiver that has not answered within this many seconds is a failed
# attempt (httpx's connect, read and write timeouts each).
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# Delays before each retry of a failed attempt (after the n-th attempt, the
# n-th delay); when none is left the delivery fails, with one alert. Svix's
# published schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
WEBHOOK_RETRY_SECONDS = [
    int(s)
    for s in env.list(
        "WEBHOOK_RETRY_SECONDS", default=["5", "300", "1800", "7200", "18000", "36000", "36000"]
    )
]
if any(delay < 0 for delay in WEBHOOK_RETRY_SECONDS):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("WEBHOOK_RETRY_SECONDS takes delays of 0 or more seconds")
# http:// and loopback/private addresses as webhook URLs: for make run and
# the tests only. Off, only https:// to public addresses.
WEBHOOK_ALLOW_LOCAL_URLS = env.bool("WEBHOOK_ALLOW_LOCAL_URLS", default=False)

# --- outbox relay -------------------------------------------------------------
OUTBOX_POLL_SECONDS = env.float("OUTBOX_POLL_SECONDS", default=1.0)
OUTBOX_BATCH_SIZE = env.int("OUTBOX_BATCH_SIZE", default=100)
# A relay pass publishes its rows as at most this many Celery tasks (a few
# rows: one task each; a burst: spread evenly over these).
OUTBOX_DISPATCH_TASKS = env.int("OUTBOX_DISPATCH_TASKS", default=16)
# A row due when it is written is handed to Celery by the process that wrote
# it, right after its commit; the relay takes it only if its consumers have not
# all run this long after (a crash between the commit and the publish, a
# broker that refused it, a worker that lost it). Off: every row waits for a
# relay pass (the unit tests' setting: tests/settings.py).
OUTBOX_HAND_OVER_ON_COMMIT = env.bool("OUTBOX_HAND_OVER_ON_COMMIT", default=True)
OUTBOX_HAND_OVER_GRACE_SECONDS = env.float("OUTBOX_HAND_OVER_GRACE_SECONDS", default=30.0)
if OUTBOX_HAND_OVER_GRACE_SECONDS < 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("OUTBOX_HAND_OVER_GRACE_SECONDS takes 0 or more seconds")
# A claimed row whose hand-off did not complete within the lease is claimed
# again by any relay; also the lease of one delivery.
OUTBOX_CLAIM_LEASE_SECONDS = env.int("OUTBOX_CLAIM_LEASE_SECONDS", default=30)
# A handed-over row whose consumers did not all finish is handed over again
# after each of these delays in turn (one redelivery per value); after the last
# redelivery it has the last delay once more to complete, then it is a dead
# letter (one alert, listed in the admin, `manage.py outbox_replay`). Growing
# and capped at a day, it spans 4.2 days of redeliveries: a consumer down over
# a long weekend still converges by itself, in 13 hand-overs in all.
OUTBOX_REDELIVER_SECONDS = [
    int(s)
    for s in env.list(
        "OUTBOX_REDELIVER_SECONDS",
        default=[
            "120",
            "300",
            "900",
            "1800",
            "3600",
            "7200",
            "14400",
            "28800",
            "43200",
            "86400",
            "86400",
            "86400",
        ],
    )
]
if not OUTBOX_REDELIVER_SECONDS or min(OUTBOX_REDELIVER_SECONDS) <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("OUTBOX_REDELIVER_SECONDS needs at least one positive delay")

# --- Celery -------------------------------------------------------------------
if "CELERY_BROKER_URL" in env:
    CELERY_BROKER_URL = env.str("CELERY_BROKER_URL")
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    # kombu's filesystem transport, as kombu ships it: real separate worker
    # processes, no broker server. Each process reads and writes the same
    # folder. Its exchanges are declared before the processes start
    # (scripts/run.sh, devtools/embedded_broker.py): kombu creates a new
    # exchange's file and only then locks it, and a process that read it in
    # between would find it empty; an existing one is locked, then read.
    _broker_dir = VAR_DIR / "broker"
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    # Remote control (celery inspect / control) binds each worker to one
    # fanout exchange at its start, all at once: the race above, on a file
    # nothing declares beforehand. Nothing of make run uses it.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="boxoffice")
# Webhook attempts have a queue of their own, consumed by their own worker
# pool (the Procfile's and Compose's "webhooks"): a receiver that hangs for the
# whole WEBHOOK_TIMEOUT_SECONDS occupies a webhook worker, never one that the
# saga's steps need (docs/design.md, "The edges").
CELERY_WEBHOOK_QUEUE = env.str(
    "CELERY_WEBHOOK_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}-webhooks"
)
# Money back has a queue of its own too, consumed by a pool of one process by
# default (the Procfile's and Compose's "refunds"): asking the processor for
# refunds and driving a cancellation's ticks, so that an event's thousands
# of refunds take at most that pool's share of the CPU from the sales path
# (docs/refunds.md, "Where refunds run"; docs/performance.md, figure 15).
CELERY_REFUND_QUEUE = env.str("CELERY_REFUND_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}-refunds")
# Charging in bursts (purchases/saga/burst.py;
# docs/design.md, "Charging in bursts"): a charge task charges its saga with
# up to this many sagas in all of its event's PENDING ones, in one commit
# before the processor is asked and one after; 1 charges one saga per task.
# The calls of a burst go to the processor this many at a time, from threads
# of the worker's process.
CHARGE_BURST_SIZE = env.int("CHARGE_BURST_SIZE", default=16)
CHARGE_BURST_CONCURRENCY = env.int("CHARGE_BURST_CONCURRENCY", default=8)
if CHARGE_BURST_SIZE < 1 or CHARGE_BURST_CONCURRENCY < 1:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("CHARGE_BURST_SIZE and CHARGE_BURST_CONCURRENCY take 1 or more")
# The waiting rooms' ticks have a queue of their own, consumed by a worker of
# its own (the Procfile's and Compose's "admission"): on the saga's queue a
# tick waited behind the very charges its room regulates and expired there,
# so the room stood still when the crowd came (docs/waiting-room.md).
CELERY_ADMISSION_QUEUE = env.str(
    "CELERY_ADMISSION_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}-admission"
)
CELERY_TASK_ROUTES = {"purchases.waiting_rooms_tick": {"queue": CELERY_ADMISSION_QUEUE}}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)

# --- email --------------------------------------------------------------------
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH", default=str(VAR_DIR / "mail"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="boxoffice <tickets@boxoffice.local>")

# --- metrics -------------------------------------------------------------------
# With several processes (gunicorn workers, Celery workers, the relay), event
# counters live in files under this folder; /metrics adds them up.
if env.str("PROMETHEUS_MULTIPROC_DIR", default=""):
    Path(env.str("PROMETHEUS_MULTIPROC_DIR")).mkdir(parents=True, exist_ok=True)

# --- logging ------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
# kv: "<time> <LEVEL> <logger> <message> key=value ..."; json: one JSON object
# per line, for log shippers (config/logging.py).
LOG_FORMAT = env.str("LOG_FORMAT", default="kv")
if LOG_FORMAT not in ("kv", "json"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("LOG_FORMAT is kv or json")
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "kv": {"()": "config.logging.KeyValueFormatter"},
        "json": {"()": "config.logging.JsonFormatter"},
        # runserver's access log, in Django's format: one line per request,
        # without the level (runserver logs each 5xx it serves at ERROR, the
        # fake gateway's deliberate 504s too; django.request tells errors).
        "django.server": {
            "()": "django.utils.log.ServerFormatter",
            "format": "[{server_time}] {message}",
            "style": "{",
        },
    },
    "filters": {
        "broker_has_no_host": {
            "()": "config.logging.DropMessages",
            "prefixes": ["No hostname was supplied."],
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT},
        "django.server": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "django.server",
        },
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        **{
            name: {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False}
            for name in ("purchases", "payments", "ledger", "outbox", "webhooks", "config")
        },
        # Django's own loggers (django.request: 4xx at WARNING, 5xx at ERROR)
        # write one line per record, in this format. Named here, they lose
        # Django's default handlers, whose "console" (DEBUG only) printed each
        # record a second time, bare, beside the root's line. Naming "django"
        # resets its children, so the access log is named again.
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.server": {"handlers": ["django.server"], "level": "INFO", "propagate": False},
        # A Celery worker sets the root logger to its --loglevel (INFO), and
        # httpx logs every request at INFO: one more line per charge and per
        # webhook attempt, which the gateway's and the attempt's own lines
        # already say (and 1 % of each pool's time, docs/performance.md).
        "httpx": {"level": "WARNING"},
    },
}
if CELERY_BROKER_URL == "filesystem://":
    # kombu's filesystem transport has no host; kombu says so, at WARNING, each
    # time a process connects to the broker.
    LOGGING["loggers"]["kombu.connection"] = {"filters": ["broker_has_no_host"]}

# --- production hardening (check --deploy) ------------------------------------
if not DEBUG:
    SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
    CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- outbox routing: topic -> consumers (each idempotent) ---------------------
# The table lives with the saga (purchases/saga/topics.py, which imports
# nothing of ours), the webhooks app's with it (webhooks/topics.py, likewise);
# the purchases app checks it at start-up.
OUTBOX_CONSUMERS = {
    str(topic): list(consumers) for topic, consumers in {**ROUTING, **WEBHOOK_ROUTING}.items()
}
# Topics whose rows the relay hands to a queue other than the default one.
OUTBOX_TOPIC_QUEUES = {
    WEBHOOK_DELIVERY: CELERY_WEBHOOK_QUEUE,
    **{str(topic): CELERY_REFUND_QUEUE for topic in REFUND_QUEUE_TOPICS},
}
# Topics whose rows handed over on commit wake one sweep for the rows that
# gather meanwhile instead of a Celery message each (outbox/sweeping.py,
# docs/performance.md). The wake flag is in the cache: it must be shared by
# every process (Redis, or the embedded file cache).
OUTBOX_SWEPT_TOPICS = [WEBHOOK_DELIVERY]
# How long a sweep waits for rows to gather before it claims: what it adds to
# a webhook's lag at most, and what makes one task carry several rows (under
# make bench's load about forty: docs/performance.md, "The webhooks' sweep").
OUTBOX_SWEEP_GATHER_SECONDS = env.float("OUTBOX_SWEEP_GATHER_SECONDS", default=0.5)
# Rows one claim of a sweep leases at most, and the longest one row's
# delivery may take (a webhook's POST: its timeout and the deadline's slack).
# The rows of a claim are delivered one after another; one is started only
# while that much still fits in the claim's lease, the rest are given back.
OUTBOX_SWEEP_BATCH = env.int("OUTBOX_SWEEP_BATCH", default=50)
OUTBOX_SWEEP_ROW_SECONDS = env.float(
    "OUTBOX_SWEEP_ROW_SECONDS", default=WEBHOOK_TIMEOUT_SECONDS + 1
)
if OUTBOX_SWEEP_GATHER_SECONDS < 0 or OUTBOX_SWEEP_BATCH < 1 or OUTBOX_SWEEP_ROW_SECONDS <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "OUTBOX_SWEEP_GATHER_SECONDS takes 0 or more seconds, OUTBOX_SWEEP_BATCH 1 or more"
        " rows, OUTBOX_SWEEP_ROW_SECONDS more than 0 seconds"
    )

# --- periodic sweeps (Celery beat) -----------------------------------------------
# How often beat runs each sweep (seconds). A sweep that has not succeeded
# within twice its interval raises a "sweep stalled" alert. A queued sweep
# older than its interval expires: the next one is already on its way.
RESUME_SWEEP_SECONDS = env.float("RESUME_SWEEP_SECONDS", default=60.0)
CHASE_SWEEP_SECONDS = env.float("CHASE_SWEEP_SECONDS", default=300.0)
AUDIT_SWEEP_SECONDS = env.float("AUDIT_SWEEP_SECONDS", default=86400.0)
SWEEP_INTERVALS = {
    "resume_sagas": RESUME_SWEEP_SECONDS,
    "chase_compensations": CHASE_SWEEP_SECONDS,
    "audit_sagas": AUDIT_SWEEP_SECONDS,
}
CELERY_BEAT_SCHEDULE = {
    name.replace("_", "-"): {
        "task": f"purchases.{name}",
        "schedule": every,
        "options": {"expires": every},
    }
    for name, every in SWEEP_INTERVALS.items()
}
# Not a sweep (no heartbeat): a look-up at the processor, only while the
# breaker is open past its reset time (purchases/breaker.py).
CELERY_BEAT_SCHEDULE["payments-breaker-trial"] = {
    "task": "purchases.breaker_trial",
    "schedule": PAYMENT_BREAKER_TRIAL_SECONDS,
    "options": {"expires": PAYMENT_BREAKER_TRIAL_SECONDS},
}

# The waiting rooms' tick (purchases/admission.py), on its own queue
# (CELERY_TASK_ROUTES above).
CELERY_BEAT_SCHEDULE["waiting-rooms-tick"] = {
    "task": "purchases.waiting_rooms_tick",
    "schedule": WAITING_ROOM_TICK_SECONDS,
    "options": {"expires": WAITING_ROOM_TICK_SECONDS},
}

# --- health checks (purchases/ops/health.py; docs/operations.md, "Health checks") ----
# /readyz and `manage.py probe` ask the database and the broker at once, each
# on a connection of its own; a check that has not answered within this many
# seconds has failed, so a probe answers in about this time whatever hangs.
HEALTH_CHECK_TIMEOUT_SECONDS = env.float("HEALTH_CHECK_TIMEOUT_SECONDS", default=2.0)
# The relay records its pulse (one UPDATE) after a pass, at most this often.
OUTBOX_RELAY_PULSE_SECONDS = env.float("OUTBOX_RELAY_PULSE_SECONDS", default=10.0)
# Who records it: the purchases app's heartbeats (outbox/pulse.py calls it by
# name; the outbox imports nothing of the apps above it).
OUTBOX_RELAY_PULSE = "purchases.ops.health.relay_pulse_record"
# The relay is not ready once its last pulse is older than this: by default
# three pulses, or three polls when the poll is longer (an idle relay passes
# once per poll).
HEALTH_RELAY_MAX_AGE_SECONDS = env.float(
    "HEALTH_RELAY_MAX_AGE_SECONDS",
    default=3 * max(OUTBOX_RELAY_PULSE_SECONDS, OUTBOX_POLL_SECONDS),
)
# Beat is judged by the sweep it runs most often (the resumer by default): not
# ready once that sweep has not started for this long, three of its intervals
# by default. A worker must run the sweep, so this also fails with no worker.
HEALTH_BEAT_MAX_AGE_SECONDS = env.float(
    "HEALTH_BEAT_MAX_AGE_SECONDS", default=3 * min(SWEEP_INTERVALS.values())
)
if (
    min(
        HEALTH_CHECK_TIMEOUT_SECONDS,
        OUTBOX_RELAY_PULSE_SECONDS,
        HEALTH_RELAY_MAX_AGE_SECONDS,
        HEALTH_BEAT_MAX_AGE_SECONDS,
    )
    <= 0
):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "HEALTH_CHECK_TIMEOUT_SECONDS, OUTBOX_RELAY_PULSE_SECONDS, HEALTH_RELAY_MAX_AGE_SECONDS "
        "and HEALTH_BEAT_MAX_AGE_SECONDS take positive seconds"
    )
# Probes speak plain HTTP to the process: no redirect to https for them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
