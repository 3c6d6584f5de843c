# One image for every process of the stack (web, worker, relay, beat, and the
# fake card processor `gateway`); the command and the environment pick the
# role. See docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so that a code change does not reinstall them: the
# runtime lock (make lock), every package pinned and checked by its hashes.
# The apps run from the source tree; nothing else is installed.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock

# The code, folder by folder. There is no .dockerignore, and .venv/, var/ (the
# embedded PostgreSQL's data and the broker folder) and .git/ must not end up in the
# image. A new app needs a line here.
# (tests/test_compose.py runs manage.py check and collectstatic on a tree made
# of these lines alone.)
COPY manage.py ./
COPY common/ common/
COPY config/ config/
COPY door/ door/
COPY ledger/ ledger/
COPY organizers/ organizers/
COPY outbox/ outbox/
COPY payments/ payments/
COPY purchases/ purchases/
COPY shop/ shop/
COPY accounts/ accounts/
COPY seller/ seller/
COPY stripe_events/ stripe_events/
COPY webhooks/ webhooks/
COPY templates/ templates/

# Run as an unprivileged user. var/ is the one place the processes write
# (celery beat's schedule file, settings.VAR_DIR).
# The admin's CSS and JS, served by WhiteNoise (gunicorn serves no files).
RUN DEBUG=false SECRET_KEY=collectstatic-only DATABASE_URL=postgres://collectstatic@127.0.0.1:1/unused \
    TICKET_KEY_SECRETS=Y29sbGVjdHN0YXRpYy1vbmx5LXRpY2tldC1rZXkhISE= \
    python manage.py collectstatic --no-input

RUN useradd --system --uid 10001 --no-create-home --home-dir /app app \
    && mkdir -p /app/var/metrics \
    && chown -R app:app /app/var
USER app

EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "-b", "0.0.0.0:8000", \
     "--worker-class", "gthread", "--workers", "3", "--threads", "4", \
     "--access-logfile", "-"]
