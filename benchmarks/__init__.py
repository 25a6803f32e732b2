"""Measurements that live beside oocgemm, never imported by it: ``python -m benchmarks --help``."""
