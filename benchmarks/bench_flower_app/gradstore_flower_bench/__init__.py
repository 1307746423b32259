"""The Flower App of scripts/bench_flower.py."""
