"""Tooling shared by the harnesses that run the stack as processes: the E2E
stack (tests/stack.py), the chaos stack (tests/chaos.py) and `make bench`
(bench/); and the embedded PostgreSQL and broker of make run (embedded_pg.py,
embedded_broker.py). Neither product code nor a test; not in the image (the
Dockerfile copies the apps folder by folder)."""
