"""Load generators for the running product (``manage.py bench_live``). Benchmarks print JSON;
they are never timed tests."""
