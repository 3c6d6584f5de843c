"""Tooling shared by the harnesses that run the stack as processes: the E2E
stack (tests/stack.py), the chaos stack (tests/chaos.py) and `make bench`
(bench/). Neither product code nor a test; not in the image (the Dockerfile
copies the apps folder by folder)."""
