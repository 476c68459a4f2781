"""The operator's commands that drive the whole product (``manage.py demo``, ``bench_live``): an
interface on the top floor, beside the API, the dashboard and the sockets."""
