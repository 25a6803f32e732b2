"""Measurements that live beside oocgemm, never imported by it (run them with ``python -m``)."""
