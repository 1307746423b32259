"""The Flower App of benchmarks/bench_flower.py."""
