"""Small helpers every part of the project shares (no models, no Django apps):
how money and times are written for people and for JSON."""
